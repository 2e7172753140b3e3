// Package storage keeps oversold's state in MySQL (MariaDB) through gorm:
// the inventory, the orders, and the replicas running against them.
//
// Its one interesting method is PlaceOrder: the guarded write of step 6 of
// the flow. One transaction inserts the order, runs the guard's UPDATE and
// checks that it changed a row; the UPDATE's reply carries the new version
// for the cache. Everything the guard refuses, and every MySQL error a caller must
// act on, comes back as one of the sentinel errors below.
package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

var (
	// ErrUnknownSKU: no inventory row for the SKU.
	ErrUnknownSKU = errors.New("storage: unknown sku")
	// ErrNotFound: no order with that id or idempotency key.
	ErrNotFound = errors.New("storage: order not found")
	// ErrConflict: the version guard found the row changed since it was
	// read, or MySQL rolled the transaction back to break a deadlock. Either
	// way nothing was written and the whole flow may be retried.
	ErrConflict = errors.New("storage: version conflict")
	// ErrStaleFence: the fencing guard found a write by a newer lock holder.
	ErrStaleFence = errors.New("storage: stale fencing token")
	// ErrOutOfStock: the atomic guard found less stock than ordered.
	ErrOutOfStock = errors.New("storage: out of stock")
	// ErrDuplicate: an order or a reservation with the same idempotency
	// key exists; the transaction was rolled back, stock write included.
	ErrDuplicate = errors.New("storage: duplicate idempotency key")
	// ErrPrecondition: PutInventory's IfVersion is not the row's version.
	ErrPrecondition = errors.New("storage: version precondition failed")
)

// MySQL error numbers the store acts on.
const (
	errDupEntry     = 1062
	errUnknownDB    = 1049
	errLockDeadlock = 1213
)

// Pool sizes: an order holds one connection for its whole transaction, and
// under a hot SKU transactions queue on the row lock, so the pool is sized
// for the replica's concurrency rather than for CPU count.
const (
	// DefaultMaxConns is the pool's size until SetMaxConns changes it
	// (OVERSOLD_MYSQL_MAX_CONNS's default).
	DefaultMaxConns = 64
	connMaxLifetime = 5 * time.Minute
)

// migrateLock serialises migrations of replicas starting at the same moment.
const migrateLock = "oversold_migrate"

// Store is the MySQL side of oversold. It is safe for concurrent use.
type Store struct {
	db       *gorm.DB
	sql      *sql.DB
	identity string // see DatabaseIdentity
}

// Open connects to the database in dsn (creating the database if the server
// does not have it yet), checks that it answers, and migrates the schema.
// It sets parseTime, loc=UTC and interpolateParams on the DSN: times come
// back as the time.Time written, and a query costs one round trip instead of
// three (prepare, execute, close). It clears clientFoundRows: the store
// reads "no row changed" as a refusal (the sweeper fence's unchanged row),
// which that option would report as one row found.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ClientFoundRows = false
	cfg.ParseTime = true
	cfg.InterpolateParams = true
	cfg.Loc = time.UTC
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second // an unreachable server fails start fast
	}

	s, err := connect(ctx, cfg)
	if mysqlErrno(err) == errUnknownDB {
		if err = createDatabase(ctx, cfg); err == nil {
			s, err = connect(ctx, cfg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", MaskDSN(cfg.FormatDSN()), err)
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("migrate %s: %w", cfg.DBName, err)
	}
	return s, nil
}

func connect(ctx context.Context, cfg *mysql.Config) (*Store, error) {
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{DSNConfig: cfg}), &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true, // single statements need no transaction of their own
		// Microseconds, UTC: what datetime(6) keeps, so a time read back
		// equals the one written.
		NowFunc: func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
	})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(DefaultMaxConns)
	sqlDB.SetMaxIdleConns(DefaultMaxConns)
	sqlDB.SetConnMaxLifetime(connMaxLifetime)
	if err := sqlDB.PingContext(ctx); err != nil {
		sqlDB.Close()
		return nil, err
	}
	return &Store{db: db, sql: sqlDB}, nil
}

// createDatabase lets orderd start on a freshly installed server.
func createDatabase(ctx context.Context, cfg *mysql.Config) error {
	server := cfg.Clone()
	server.DBName = ""
	db, err := sql.Open("mysql", server.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	name := "`" + strings.ReplaceAll(cfg.DBName, "`", "``") + "`"
	_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name)
	return err
}

// migrate runs AutoMigrate under a MySQL named lock held on one dedicated
// connection: three replicas starting at once would otherwise race each
// other's CREATE TABLE and ALTER statements. The lock lives as long as that
// session, so it is released explicitly before the connection goes back to
// the pool.
func (s *Store) migrate(ctx context.Context) error {
	conn, err := s.sql.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 30)", migrateLock).Scan(&got); err != nil {
		return err
	}
	if got.Int64 != 1 {
		return fmt.Errorf("another replica held the %s lock for 30s", migrateLock)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", migrateLock)
	db := s.db.WithContext(ctx)
	if err := db.AutoMigrate(&Inventory{}, &Order{}, &Replica{}, &Meta{}, &Reservation{}, &Fence{}, &ReservationMove{}, &IdempotencyKey{}, &QueuedOrder{}); err != nil {
		return err
	}
	// Tables made before identities were exact strings: AutoMigrate does
	// not change a column's collation, so the columns are changed here.
	if err := binaryColumns(ctx, db); err != nil {
		return err
	}
	// Orders placed under a key before fingerprints were kept get theirs
	// (the same digest as OrderFingerprint, computed by MySQL).
	err = db.Exec(`UPDATE orders SET fingerprint = UNHEX(SHA2(CONCAT('order', CHAR(10), sku, CHAR(10), quantity), 256))
		WHERE fingerprint IS NULL AND idempotency_key IS NOT NULL`).Error
	if err != nil {
		return err
	}
	// Keys written before the shared key table, or since by a replica of
	// an older version, join it: afterwards no request of either kind can
	// take them again. Where an older version let one key make both an
	// order and a reservation, the order keeps it.
	// READ COMMITTED: the SELECT then reads without locking, so running
	// replicas' keyed writes do not wait for the scan (under REPEATABLE
	// READ it share-locks every row it reads).
	err = db.Transaction(func(tx *gorm.DB) error {
		for _, q := range []string{
			`INSERT IGNORE INTO idempotency_keys (idempotency_key, kind, ref, created_at)
				SELECT idempotency_key, 'order', id, created_at FROM orders WHERE idempotency_key IS NOT NULL`,
			`INSERT IGNORE INTO idempotency_keys (idempotency_key, kind, ref, created_at)
				SELECT idempotency_key, 'reservation', id, created_at FROM reservations WHERE idempotency_key IS NOT NULL`,
		} {
			if err := tx.Exec(q).Error; err != nil {
				return err
			}
		}
		return nil
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("idempotency keys: %w", err)
	}
	// The first migration of a database names it for good.
	err = db.Exec("INSERT IGNORE INTO meta (name, value) VALUES (?, ?)", identityName, uuid.NewString()).Error
	if err != nil {
		return err
	}
	return db.Raw("SELECT value FROM meta WHERE name = ?", identityName).Row().Scan(&s.identity)
}

// identityName is the meta row of DatabaseIdentity.
const identityName = "database_identity"

// DatabaseIdentity is a random name written at the database's first
// migration and never changed: a dropped and recreated database, or another
// deployment's, has another. The stock cache keeps its entries under it, so
// that entries of one database are never taken for another's.
func (s *Store) DatabaseIdentity() string { return s.identity }

// exactColumns are the columns that hold a client's identity strings, with
// their types.
var exactColumns = []struct{ table, column, typ string }{
	{"inventory", "sku", "VARBINARY(64) NOT NULL"},
	{"orders", "id", "VARBINARY(36) NOT NULL"},
	{"orders", "sku", "VARBINARY(64) NOT NULL"},
	{"orders", "idempotency_key", "VARBINARY(255) NULL"},
}

// claimKeys inserts keys into idempotency_keys, in tx: a key some request
// already holds (committed, or once its transaction commits) is
// ErrDuplicate, and the caller's transaction rolls back with it.
func claimKeys(tx *gorm.DB, kind string, keys, refs []string) error {
	if len(keys) == 0 {
		return nil
	}
	q := "INSERT INTO idempotency_keys (idempotency_key, kind, ref, created_at) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, UTC_TIMESTAMP(6)), ", len(keys)), ", ")
	args := make([]any, 0, 3*len(keys))
	for i, k := range keys {
		args = append(args, k, kind, refs[i])
	}
	err := tx.Exec(q, args...).Error
	if mysqlErrno(err) == errDupEntry {
		return fmt.Errorf("%w: %w", ErrDuplicate, err)
	}
	return err
}

// binaryColumns changes the exactColumns that are not VARBINARY yet. Case
// variants cannot already collide in them: the old collation's UNIQUE and
// PRIMARY indexes kept one of each, and binary comparison only splits rows.
func binaryColumns(ctx context.Context, db *gorm.DB) error {
	for _, c := range exactColumns {
		var typ string
		err := db.Raw(`SELECT DATA_TYPE FROM information_schema.COLUMNS
			WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?`, c.table, c.column).Row().Scan(&typ)
		if err != nil {
			return fmt.Errorf("column %s.%s: %w", c.table, c.column, err)
		}
		if strings.EqualFold(typ, "varbinary") {
			continue
		}
		if err := db.Exec(fmt.Sprintf("ALTER TABLE `%s` MODIFY `%s` %s", c.table, c.column, c.typ)).Error; err != nil {
			return fmt.Errorf("column %s.%s to %s: %w", c.table, c.column, c.typ, err)
		}
	}
	return nil
}

// Close closes the connection pool.
func (s *Store) Close() error { return s.sql.Close() }

// Ping checks that MySQL answers.
func (s *Store) Ping(ctx context.Context) error { return s.sql.PingContext(ctx) }

// mysqlErrno returns the MySQL error number inside err, or 0.
func mysqlErrno(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// MaskDSN returns dsn with its password replaced by ***, for logs and
// messages. It follows the driver's grammar
// [user[:password]@][net[(addr)]]/dbname[?params]: the password ends at the
// last '@' before the last '/'.
func MaskDSN(dsn string) string {
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		slash = len(dsn)
	}
	at := strings.LastIndexByte(dsn[:slash], '@')
	if at < 0 {
		return dsn
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 {
		return dsn
	}
	return dsn[:colon+1] + "***" + dsn[at:]
}
