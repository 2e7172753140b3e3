package loadtest

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
)

// The tables orderd keeps in MySQL (package storage). The checker reads them
// with its own SQL rather than through storage.Audit: what checks the code
// must not share code with it, and opening a storage.Store migrates.
const (
	inventoryTable = "inventory"
	ordersTable    = "orders"
)

// Expect is what the client side knows about a run.
type Expect struct {
	SKUs         []string // the run's SKUs, nobody else's
	InitialStock int      // per SKU, as reset before the load
	Acked        []string // ids of the orders acknowledged with 201
	// SoldOut are the SKUs on which some order was refused out_of_stock:
	// the stock MySQL still holds on them is undersold.
	SoldOut []string
}

// Invariants is what MySQL holds after a run, against docs/design.md's
// invariants. Stock figures are summed over the run's SKUs; Oversold and
// LostUpdates are computed per SKU and then summed, so one SKU's oversell is
// never hidden by another's undersell.
type Invariants struct {
	InitialStock    int
	FinalStock      int
	OrderedQuantity int
	Oversold        int      // Σ max(0, ordered - initial)
	LostUpdates     int      // Σ |initial - final - ordered|
	LostAcks        int      // 201s whose order MySQL does not hold
	Duplicates      int      // Idempotency-Keys with more than one order
	Undersold       int      // Σ final stock of the SKUs in Expect.SoldOut
	MissingIDs      []string // the first few lost acks, for the report
}

// Check reads the run's SKUs back from MySQL and measures the invariants.
// An error means the check could not be made, not that an invariant failed.
func Check(ctx context.Context, db *sql.DB, exp Expect) (Invariants, error) {
	var inv Invariants
	if len(exp.SKUs) == 0 {
		return inv, fmt.Errorf("check: no SKUs")
	}
	in, args := placeholders(exp.SKUs)

	final := map[string]int{}
	if err := eachRow(ctx, db, func(rows *sql.Rows) error {
		var sku string
		var stock int
		if err := rows.Scan(&sku, &stock); err != nil {
			return err
		}
		final[sku] = stock
		return nil
	}, "SELECT sku, stock FROM "+inventoryTable+" WHERE sku IN "+in, args...); err != nil {
		return inv, fmt.Errorf("check: final stock: %w", err)
	}

	ordered := map[string]int{}
	if err := eachRow(ctx, db, func(rows *sql.Rows) error {
		var sku string
		var qty int
		if err := rows.Scan(&sku, &qty); err != nil {
			return err
		}
		ordered[sku] = qty
		return nil
	}, "SELECT sku, SUM(quantity) FROM "+ordersTable+" WHERE sku IN "+in+" GROUP BY sku", args...); err != nil {
		return inv, fmt.Errorf("check: ordered quantity: %w", err)
	}

	for _, sku := range exp.SKUs {
		f, ok := final[sku]
		if !ok {
			return inv, fmt.Errorf("check: SKU %q has no %s row", sku, inventoryTable)
		}
		o := ordered[sku]
		inv.InitialStock += exp.InitialStock
		inv.FinalStock += f
		inv.OrderedQuantity += o
		inv.Oversold += max(0, o-exp.InitialStock)
		inv.LostUpdates += abs(exp.InitialStock - f - o)
		if slices.Contains(exp.SoldOut, sku) {
			inv.Undersold += max(0, f) // customers turned away while stock remained
		}
	}

	// GROUP BY, not trust in the unique index: the check must see what the
	// schema was meant to prevent.
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT idempotency_key FROM "+ordersTable+
		" WHERE sku IN "+in+" AND idempotency_key IS NOT NULL AND idempotency_key <> ''"+
		" GROUP BY idempotency_key HAVING COUNT(*) > 1) AS d", args...).Scan(&inv.Duplicates)
	if err != nil {
		return inv, fmt.Errorf("check: duplicates: %w", err)
	}

	missing, err := missingOrders(ctx, db, exp.Acked)
	if err != nil {
		return inv, fmt.Errorf("check: lost acks: %w", err)
	}
	inv.LostAcks = len(missing)
	inv.MissingIDs = missing[:min(len(missing), 5)]
	return inv, nil
}

// missingOrders returns the acknowledged ids that no order row holds. Ids are
// compared as text, so numeric and string ids both work; an empty id (a 201
// whose body named no order) can never be found and counts as missing.
func missingOrders(ctx context.Context, db *sql.DB, acked []string) ([]string, error) {
	const batch = 500
	found := map[string]bool{}
	for start := 0; start < len(acked); start += batch {
		ids := acked[start:min(start+batch, len(acked))]
		in, args := placeholders(ids)
		err := eachRow(ctx, db, func(rows *sql.Rows) error {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			found[id] = true
			return nil
		}, "SELECT CAST(id AS CHAR) FROM "+ordersTable+" WHERE id IN "+in, args...)
		if err != nil {
			return nil, err
		}
	}
	var missing []string
	for _, id := range acked {
		if !found[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// eachRow runs query and hands every row to scan.
func eachRow(ctx context.Context, db *sql.DB, scan func(*sql.Rows) error, query string, args ...any) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// placeholders returns "(?,?,...)" and the values for an IN clause.
func placeholders(values []string) (string, []any) {
	args := make([]any, len(values))
	for i, v := range values {
		args[i] = v
	}
	return "(" + strings.TrimSuffix(strings.Repeat("?,", len(values)), ",") + ")", args
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
