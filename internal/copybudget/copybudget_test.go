// Package copybudget keeps each lock copyable in one sitting: the non-test
// Go and Lua a team reads to copy a backend's recipe, counted over the
// project packages the recipe reaches, stays within a budget of half what
// the same locks took when recipe and hardening were one package.
package copybudget

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/oversold-lab/oversold"

// budgets are in lines; before the split the same packages reached
// redislock 2,337, redlock 2,532, zklock 1,610, etcdlock 1,583 and
// mysqllock 1,982 (locking/README.md, "Copying one lock").
var budgets = map[string]int{
	"redislock": 1168,
	"redlock":   1266,
	"zklock":    805,
	"etcdlock":  791,
	"mysqllock": 991,
}

func TestCopyBudget(t *testing.T) {
	for backend, budget := range budgets {
		t.Run(backend, func(t *testing.T) {
			lines, files := reachable(t, "./locking/"+backend)
			t.Logf("%s: %d lines in %d files (budget %d)", backend, lines, len(files), budget)
			if lines > budget {
				t.Errorf("%s reaches %d lines of the project's Go and Lua, budget %d: move hardening out of the recipe's reach\n%s",
					backend, lines, budget, strings.Join(files, "\n"))
			}
		})
	}
}

// reachable counts the lines of the non-test Go files, and the Lua files
// beside them (embedded scripts), of every project package pkg depends on,
// itself included.
func reachable(t *testing.T, pkg string) (int, []string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}}", pkg)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	total := 0
	var files []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) != 3 || !strings.HasPrefix(fields[0], module) {
			continue
		}
		dir := fields[1]
		names := strings.Fields(fields[2])
		lua, _ := filepath.Glob(filepath.Join(dir, "*.lua"))
		for _, l := range lua {
			names = append(names, filepath.Base(l))
		}
		for _, name := range names {
			n := countLines(t, filepath.Join(dir, name))
			total += n
			rel := strings.TrimPrefix(fields[0], module+"/")
			files = append(files, fmt.Sprintf("%6d %s/%s", n, rel, name))
		}
	}
	if total == 0 {
		t.Fatalf("no files reached from %s: the package moved?", pkg)
	}
	return total, files
}

func countLines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}
