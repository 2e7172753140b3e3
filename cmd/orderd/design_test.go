package main

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/designdoc"
)

// TestDesignTable checks docs/design.md's configuration table against
// orderd's settings both ways: every variable orderd reads is documented
// with its default, and every documented variable is one orderd reads. A
// setting added to one and not the other fails here. The lab-only fault
// hook is outside the table by design.
func TestDesignTable(t *testing.T) {
	rows, err := designdoc.ConfigTable()
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]designdoc.Setting{}
	for _, r := range rows {
		documented[r.Variable] = r
	}
	read := map[string]bool{}
	for _, s := range settings {
		if s.env == "OVERSOLD_FAULT_HOOK" {
			continue
		}
		read[s.env] = true
		r, ok := documented[s.env]
		switch {
		case !ok:
			t.Errorf("orderd reads %s; docs/design.md's configuration table does not list it", s.env)
		case s.def != "" && r.Default != s.def:
			t.Errorf("%s: docs/design.md says the default is %q, orderd's is %q", s.env, r.Default, s.def)
		}
	}
	for _, r := range rows {
		if !read[r.Variable] {
			t.Errorf("docs/design.md lists %s; orderd does not read it", r.Variable)
		}
	}
}
