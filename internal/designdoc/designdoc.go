// Package designdoc reads the tables of docs/design.md that code must agree
// with, so tests check the document against the code instead of copying it.
package designdoc

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Setting is one row of the orderd configuration table.
type Setting struct {
	Variable, Meaning, Default string
}

// Path is docs/design.md in this repository, found from this source file
// so that tests in any package read the same file.
func Path() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "design.md")
}

// ConfigTable returns the rows of the table under "## orderd configuration".
func ConfigTable() ([]Setting, error) {
	b, err := os.ReadFile(Path())
	if err != nil {
		return nil, err
	}
	rows, err := table(string(b), "## orderd configuration")
	if err != nil {
		return nil, err
	}
	var out []Setting
	for _, r := range rows {
		if len(r) != 3 {
			return nil, fmt.Errorf("docs/design.md: configuration row %q has %d cells, want 3", r, len(r))
		}
		out = append(out, Setting{Variable: r[0], Meaning: r[1], Default: r[2]})
	}
	return out, nil
}

// GuardWrite is one row of the table under "## Guards": a guard and its
// write of step 6, as the document quotes it (without the backquotes).
type GuardWrite struct {
	Guard, Write string
}

// GuardTable returns the rows of the table under "## Guards".
func GuardTable() ([]GuardWrite, error) {
	b, err := os.ReadFile(Path())
	if err != nil {
		return nil, err
	}
	rows, err := table(string(b), "## Guards")
	if err != nil {
		return nil, err
	}
	var out []GuardWrite
	for _, r := range rows {
		if len(r) != 3 {
			return nil, fmt.Errorf("docs/design.md: guard row %q has %d cells, want 3", r, len(r))
		}
		out = append(out, GuardWrite{Guard: r[0], Write: strings.Trim(r[1], "`")})
	}
	return out, nil
}

// table returns the body rows of the first Markdown table in the section
// that starts with heading, each row's cells trimmed.
func table(doc, heading string) ([][]string, error) {
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		return nil, fmt.Errorf("docs/design.md has no section %q", heading)
	}
	section := doc[i+1+len(heading):]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	var rows [][]string
	inTable := false
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for k := range cells {
			cells[k] = strings.TrimSpace(cells[k])
		}
		switch {
		case !inTable: // the header row
			inTable = true
		case strings.HasPrefix(cells[0], "---"):
		default:
			rows = append(rows, cells)
		}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("docs/design.md: section %q has no table", heading)
	}
	return rows, nil
}
