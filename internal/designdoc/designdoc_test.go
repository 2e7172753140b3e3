package designdoc

import "testing"

func TestTable(t *testing.T) {
	doc := "# t\n\n## a\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n## orderd configuration\n\ntext | not a row\n\n| variable | meaning | default |\n|---|---|---|\n| A | first | 1 |\n| B | second, with `code` | |\n\nafter\n\n| C | other table | 3 |\n\n## next\n\n| D | d | 4 |\n"
	rows, err := table(doc, "## orderd configuration")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0][0] != "A" || rows[1][1] != "second, with `code`" || rows[1][2] != "" {
		t.Fatalf("rows = %q, want A and B only, cells trimmed", rows)
	}
	if _, err := table(doc, "## missing"); err == nil {
		t.Fatal("a missing section gave no error")
	}
}

// TestConfigTable reads the real document: fifteen-odd rows, each a variable.
func TestConfigTable(t *testing.T) {
	rows, err := ConfigTable()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < 10 || rows[0].Variable != "OVERSOLD_ADDR" {
		t.Fatalf("ConfigTable() = %v; want the orderd settings from OVERSOLD_ADDR on", rows)
	}
}
