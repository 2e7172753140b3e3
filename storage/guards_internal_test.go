package storage

import (
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/internal/designdoc"
)

// guardSQL is every guard's SQL in full, as docs/design.md states it
// (there without the version bump, updated_at and the argument list).
var guardSQL = []struct {
	guard      Guard
	decrement  bool // Write.Decrement: guard none behind the stock gate
	update     string
	updateArgs []any
	move       string
	moveArgs   []any
	traits     string // the rule's true predicates, in the order of traitsOf
	refuses    error  // refuse of a row whose fence is below the lease's
}{
	{GuardNone, false,
		"UPDATE inventory SET stock = ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6) WHERE sku = ?",
		[]any{int64(5), "sku-1"},
		"UPDATE inventory SET stock = ?, reserved = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6) WHERE sku = ?",
		[]any{int64(8), int64(6), "sku-1"},
		"insertFirst trustsCache", nil},
	{GuardNone, true,
		"UPDATE inventory SET stock = stock - ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6) WHERE sku = ?",
		[]any{int64(5), "sku-1"},
		"UPDATE inventory SET stock = ?, reserved = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6) WHERE sku = ?",
		[]any{int64(8), int64(6), "sku-1"},
		"insertFirst inPlace trustsCache", nil},
	{GuardVersion, false,
		"UPDATE inventory SET stock = ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6) WHERE sku = ? AND version = ?",
		[]any{int64(5), "sku-1", uint64(7)},
		"UPDATE inventory SET stock = ?, reserved = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6) WHERE sku = ? AND version = ?",
		[]any{int64(8), int64(6), "sku-1", uint64(7)},
		"checks", ErrConflict},
	{GuardFencing, false,
		"UPDATE inventory SET stock = ?, fence = ?, fence_epoch = ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6) WHERE sku = ? AND (fence_epoch, fence) < (?, ?) AND version = ?",
		[]any{int64(5), uint64(9), uint64(3), "sku-1", uint64(3), uint64(9), uint64(7)},
		"UPDATE inventory SET stock = ?, reserved = ?, fence = ?, fence_epoch = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6) WHERE sku = ? AND (fence_epoch, fence) < (?, ?) AND version = ?",
		[]any{int64(8), int64(6), uint64(9), uint64(3), "sku-1", uint64(3), uint64(9), uint64(7)},
		"insertFirst trustsCache fenced checks", ErrConflict},
	{GuardAtomic, false,
		"UPDATE inventory SET stock = stock - ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6) WHERE sku = ? AND stock >= ?",
		[]any{int64(5), "sku-1", int64(5)},
		"UPDATE inventory SET stock = stock + ?, reserved = reserved + ?, version = version + 1, updated_at = UTC_TIMESTAMP(6) WHERE sku = ? AND stock + ? >= 0 AND reserved + ? >= 0",
		[]any{int64(-2), int64(2), "sku-1", int64(-2), int64(2)},
		"insertFirst inPlace checks", ErrOutOfStock},
}

// TestGuardSQL: each guard's rule yields exactly its statements and
// arguments, for an order write of 2 + 3 from stock 10 and for a hold of 2
// from stock 10 reserved 4, both read at version 7 under lease (3, 9).
func TestGuardSQL(t *testing.T) {
	for _, c := range guardSQL {
		r, err := c.guard.rule()
		if err != nil {
			t.Fatal(err)
		}
		w := Write{Guard: c.guard, Orders: []Order{{SKU: "sku-1", Quantity: 2}, {SKU: "sku-1", Quantity: 3}},
			Stock: 10, Version: 7, Epoch: 3, Token: 9, Decrement: c.decrement}
		m := Move{Seen: Inventory{SKU: "sku-1", Stock: 10, Reserved: 4, Version: 7}, Epoch: 3, Token: 9, Stock: -2, Reserved: 2}
		name := string(c.guard)
		if c.decrement {
			name += "+decrement"
		}
		if q, args := r.update(w); oneLine(q) != c.update || !reflect.DeepEqual(args, c.updateArgs) {
			t.Errorf("%s: update\n%s %v\nwant\n%s %v", name, oneLine(q), args, c.update, c.updateArgs)
		}
		if q, args := r.move(m); oneLine(q) != c.move || !reflect.DeepEqual(args, c.moveArgs) {
			t.Errorf("%s: move\n%s %v\nwant\n%s %v", name, oneLine(q), args, c.move, c.moveArgs)
		}
		if got := traitsOf(r, w); got != c.traits {
			t.Errorf("%s: traits %q, want %q", name, got, c.traits)
		}
		err = r.refuse(Inventory{SKU: "sku-1", FenceEpoch: 3, Fence: 8}, 3, 9)
		if c.refuses == nil && (err == nil || errors.Is(err, ErrConflict) || errors.Is(err, ErrOutOfStock)) || c.refuses != nil && !errors.Is(err, c.refuses) {
			t.Errorf("%s: refuse = %v, want %v", name, err, c.refuses)
		}
	}
	// A newer holder's fence (3, 9) is not below the lease's: stale.
	if err := (fencingGuard{}).refuse(Inventory{FenceEpoch: 3, Fence: 9}, 3, 9); !errors.Is(err, ErrStaleFence) {
		t.Errorf("fencing refuse under a fence as new as the lease = %v, want ErrStaleFence", err)
	}
	for _, g := range Guards {
		if _, err := g.rule(); err != nil {
			t.Errorf("guard %s has no rule: %v", g, err)
		}
	}
	if _, err := Guard("optimistic").rule(); err == nil {
		t.Error("an unknown guard has a rule")
	}
}

// TestGuardSQLAsDocumented: each guard's WHERE clause is the one
// docs/design.md quotes, and the statement sets every column it names.
func TestGuardSQLAsDocumented(t *testing.T) {
	rows, err := designdoc.GuardTable()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(Guards) {
		t.Errorf("docs/design.md lists %d guards, want %d", len(rows), len(Guards))
	}
	param := regexp.MustCompile(`:[a-z]+`)
	for _, row := range rows {
		g, err := ParseGuard(row.Guard)
		if err != nil {
			t.Errorf("docs/design.md: %v", err)
			continue
		}
		r, _ := g.rule()
		query, _ := r.update(Write{Guard: g, Orders: []Order{{SKU: "sku-1", Quantity: 1}}})
		set, where, _ := strings.Cut(oneLine(query), " WHERE ")
		docSet, docWhere, _ := strings.Cut(param.ReplaceAllString(row.Write, "?"), " WHERE ")
		if where != docWhere {
			t.Errorf("guard %s: WHERE %s, docs/design.md says WHERE %s", g, where, docWhere)
		}
		for _, a := range strings.Split(strings.TrimPrefix(docSet, "SET "), ", ") {
			col, _, _ := strings.Cut(a, " = ")
			if !strings.Contains(set, " "+col+" = ") {
				t.Errorf("guard %s: %s sets no %s, docs/design.md says it sets %s", g, set, col, a)
			}
		}
	}
}

// oneLine is q with every run of white space made one space.
func oneLine(q string) string { return strings.Join(strings.Fields(q), " ") }

// traitsOf lists r's true predicates for w.
func traitsOf(r rule, w Write) string {
	var out []string
	for _, t := range []struct {
		name string
		is   bool
	}{{"insertFirst", r.insertFirst()}, {"inPlace", r.inPlace(w)}, {"trustsCache", r.trustsCache()}, {"fenced", r.fenced()}, {"checks", r.checks()}} {
		if t.is {
			out = append(out, t.name)
		}
	}
	return strings.Join(out, " ")
}
