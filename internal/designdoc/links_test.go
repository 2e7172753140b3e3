package designdoc

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksStayInside: every relative link in the repository's Markdown
// names a file that exists inside the repository, so a fresh clone has
// everything its documents point to (docs/design.md, not a file beside
// the clone).
func TestLinksStayInside(t *testing.T) {
	root, err := filepath.Abs(filepath.Join(filepath.Dir(Path()), ".."))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "lab-report") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			abs := filepath.Join(filepath.Dir(path), target)
			rel, _ := filepath.Rel(root, path)
			checked++
			if abs != root && !strings.HasPrefix(abs, root+string(filepath.Separator)) {
				t.Errorf("%s links to %s, outside the repository", rel, m[1])
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked %d links; the walk missed the documents", checked)
	}
}
