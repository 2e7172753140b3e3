package loadtest

import (
	"database/sql"
	"fmt"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/storage"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// crafted is the state a run left in MySQL.
type crafted struct {
	stock    map[string]int // final stock per SKU
	orders   []craftedOrder
	noUnique bool // drop the unique index on idempotency_key first
}

type craftedOrder struct {
	id, sku, key string
}

// database returns a connection to a fresh database with orderd's own
// schema (storage migrates it) holding c.
func (c crafted) database(t *testing.T) *sql.DB {
	t.Helper()
	dsn := testbed.MySQL(t)
	st, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(t.Context(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if c.noUnique {
		var index string
		err := db.QueryRowContext(t.Context(), `SELECT index_name FROM information_schema.statistics
			WHERE table_schema = DATABASE() AND table_name = 'orders' AND column_name = 'idempotency_key'`).Scan(&index)
		if err != nil {
			t.Fatal(err)
		}
		exec("ALTER TABLE orders DROP INDEX `" + index + "`")
	}
	for sku, stock := range c.stock {
		exec("INSERT INTO inventory (sku, stock, version, fence, created_at, updated_at) VALUES (?, ?, 0, 0, NOW(6), NOW(6))", sku, stock)
	}
	for _, o := range c.orders {
		exec("INSERT INTO orders (id, sku, quantity, status, instance, `lock`, token, idempotency_key, created_at)"+
			" VALUES (?, ?, 1, 'confirmed', 'r1', 'local', 0, ?, NOW(6))", o.id, o.sku, o.key)
	}
	return db
}

// ordersOf makes n orders of sku with ids and keys "<sku>-<i>".
func ordersOf(sku string, n int) []craftedOrder {
	out := make([]craftedOrder, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", sku, i+1)
		out[i] = craftedOrder{id: id, sku: sku, key: "key-" + id}
	}
	return out
}

func ids(orders []craftedOrder) []string {
	out := make([]string, len(orders))
	for i, o := range orders {
		out[i] = o.id
	}
	return out
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		state crafted
		exp   Expect
		want  Invariants
	}{{
		name:  "clean run: sold exactly the stock",
		state: crafted{stock: map[string]int{"a": 0}, orders: ordersOf("a", 5)},
		exp:   Expect{SKUs: []string{"a"}, InitialStock: 5, Acked: ids(ordersOf("a", 5))},
		want:  Invariants{InitialStock: 5, FinalStock: 0, OrderedQuantity: 5},
	}, {
		name:  "clean run: stock left over",
		state: crafted{stock: map[string]int{"a": 2}, orders: ordersOf("a", 3)},
		exp:   Expect{SKUs: []string{"a"}, InitialStock: 5, Acked: ids(ordersOf("a", 3))},
		want:  Invariants{InitialStock: 5, FinalStock: 2, OrderedQuantity: 3},
	}, {
		name:  "oversold: two replicas sold the last units twice",
		state: crafted{stock: map[string]int{"a": 0}, orders: ordersOf("a", 7)},
		exp:   Expect{SKUs: []string{"a"}, InitialStock: 5, Acked: ids(ordersOf("a", 7))},
		want:  Invariants{InitialStock: 5, FinalStock: 0, OrderedQuantity: 7, Oversold: 2, LostUpdates: 2},
	}, {
		name:  "lost update without oversell",
		state: crafted{stock: map[string]int{"a": 3}, orders: ordersOf("a", 3)},
		exp:   Expect{SKUs: []string{"a"}, InitialStock: 5, Acked: ids(ordersOf("a", 3))},
		want:  Invariants{InitialStock: 5, FinalStock: 3, OrderedQuantity: 3, LostUpdates: 1},
	}, {
		name:  "lost ack: a 201 whose order MySQL does not hold",
		state: crafted{stock: map[string]int{"a": 3}, orders: ordersOf("a", 2)},
		exp:   Expect{SKUs: []string{"a"}, InitialStock: 5, Acked: append(ids(ordersOf("a", 2)), "a-ghost", "")},
		want: Invariants{InitialStock: 5, FinalStock: 3, OrderedQuantity: 2, LostAcks: 2,
			MissingIDs: []string{"a-ghost", ""}},
	}, {
		name: "duplicates: one key, two orders",
		state: crafted{stock: map[string]int{"a": 3}, noUnique: true, orders: []craftedOrder{
			{"o1", "a", "k1"}, {"o2", "a", "k1"}, {"o3", "a", "k2"}, {"o4", "a", "k2"}, {"o5", "a", "k3"},
		}},
		exp:  Expect{SKUs: []string{"a"}, InitialStock: 8, Acked: []string{"o1", "o3", "o5"}},
		want: Invariants{InitialStock: 8, FinalStock: 3, OrderedQuantity: 5, Duplicates: 2},
	}, {
		name: "per SKU: one SKU's undersell does not hide another's oversell",
		state: crafted{stock: map[string]int{"a": 0, "b": 2, "other": 0},
			orders: append(ordersOf("a", 3), ordersOf("other", 9)...)},
		exp:  Expect{SKUs: []string{"a", "b"}, InitialStock: 2, Acked: ids(ordersOf("a", 3))},
		want: Invariants{InitialStock: 4, FinalStock: 2, OrderedQuantity: 3, Oversold: 1, LostUpdates: 1},
	}, {
		name:  "clean run: undersold, stock left on a SKU that refused out_of_stock",
		state: crafted{stock: map[string]int{"a": 2, "b": 1}, orders: append(ordersOf("a", 3), ordersOf("b", 4)...)},
		exp: Expect{SKUs: []string{"a", "b"}, InitialStock: 5, Acked: append(ids(ordersOf("a", 3)), ids(ordersOf("b", 4))...),
			SoldOut: []string{"a"}},
		want: Invariants{InitialStock: 10, FinalStock: 3, OrderedQuantity: 7, Undersold: 2},
	}, {
		name:  "clean run: stock left but nothing refused is not undersold",
		state: crafted{stock: map[string]int{"a": 2}, orders: ordersOf("a", 3)},
		exp:   Expect{SKUs: []string{"a"}, InitialStock: 5, Acked: ids(ordersOf("a", 3)), SoldOut: []string{"elsewhere"}},
		want:  Invariants{InitialStock: 5, FinalStock: 2, OrderedQuantity: 3},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := tc.state.database(t)
			got, err := Check(t.Context(), db, tc.exp)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			clean := got.Oversold == 0 && got.LostUpdates == 0 && got.LostAcks == 0 && got.Duplicates == 0
			if wantClean := tc.name[:5] == "clean"; clean != wantClean {
				t.Errorf("clean = %v, want %v", clean, wantClean)
			}
		})
	}
}

func TestCheckUnknownSKU(t *testing.T) {
	db := crafted{stock: map[string]int{"a": 1}}.database(t)
	if _, err := Check(t.Context(), db, Expect{SKUs: []string{"a", "missing"}, InitialStock: 1}); err == nil {
		t.Fatal("a SKU without an inventory row passed the check")
	}
}
