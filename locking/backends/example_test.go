package backends_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
)

// Open a lock by name, hold it, check it before a write, and release it
// on a fresh bounded context. "local" needs no server; "redis", "redlock",
// "zookeeper", "mysql" and "etcd" take their addresses from Config and
// keep the same contract (examples/sell-one runs it on Redis and MySQL).
func ExampleOpen() {
	ctx := context.Background()
	locker, err := backends.Open(ctx, "local", backends.Config{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "sku/sku-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding", lease.Key(), "token", lease.Token())

	// Just before the guarded write: a lost lease must not write.
	select {
	case <-lease.Lost():
		fmt.Println("lease lost: do not write")
	default:
		fmt.Println("lease held: write, guarded by version or by token")
	}

	// Release after the commit, on a context of its own: the caller's may
	// be cancelled by then.
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fmt.Println("release:", lease.Release(rctx))
	fmt.Println("again:", errors.Is(lease.Release(rctx), locking.ErrNotHeld))
	// Output:
	// holding sku/sku-1 token 1
	// lease held: write, guarded by version or by token
	// release: <nil>
	// again: true
}

// A wait for a held lock ends with the caller's context, and the error
// says so: errors.Is(err, context.DeadlineExceeded).
func ExampleOpen_waitBounded() {
	ctx := context.Background()
	locker, _ := backends.Open(ctx, "local", backends.Config{})
	defer locker.Close()

	first, _ := locker.Acquire(ctx, "sku/sku-1")
	wait, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := locker.Acquire(wait, "sku/sku-1")
	fmt.Println("second holder:", errors.Is(err, context.DeadlineExceeded))

	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	fmt.Println("release:", first.Release(rctx))
	// Output:
	// second holder: true
	// release: <nil>
}
