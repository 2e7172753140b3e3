// Command sell-one sells one unit of a SKU as oversold's order flow does:
// take the SKU's lock, read the row, write it with a guarded UPDATE in one
// MySQL transaction, commit, then release. Copy it into your service;
// docs/adopt.md explains each step and the table it needs (Schema).
//
//	go run ./examples/sell-one -lock redis -redis localhost:6379 \
//	  -dsn 'user:pass@tcp(localhost:3306)/shop' -guard version sku-1
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	_ "github.com/go-sql-driver/mysql"
	"github.com/oversold-lab/oversold/locking/backends"
)

// run opens the lock by name (backends.Open) and MySQL, and sells one unit
// (Sell, in sell.go: the part to copy).
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("sell-one", flag.ContinueOnError)
	lock := fs.String("lock", "redis", fmt.Sprint("lock backend: ", backends.Names))
	guard := fs.String("guard", "version", "version, fencing or atomic")
	var cfg backends.Config
	fs.StringVar(&cfg.RedisAddr, "redis", "localhost:6379", "Redis address, for lock redis")
	fs.StringVar(&cfg.MySQLDSN, "dsn", "", "MySQL DSN of the database with the stock table")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return errors.Join(errors.New("usage: sell-one [flags] SKU"), err)
	}
	db, err := sql.Open("mysql", cfg.MySQLDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	locker, err := backends.Open(ctx, *lock, cfg)
	if err != nil {
		return err
	}
	defer locker.Close()
	if err := Sell(ctx, locker, db, *guard, fs.Arg(0)); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "sold 1 of %s under %s/%s\n", fs.Arg(0), *lock, *guard)
	return err
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sell-one:", err)
		os.Exit(1)
	}
}
