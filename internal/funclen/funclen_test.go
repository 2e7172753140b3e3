package funclen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

const maxLines = 80

// trees are the package trees the bound covers, relative to the module root.
var trees = []string{"order", "storage", "inventory", "locking"}

func TestNoFunctionOver80Lines(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	for _, tree := range trees {
		root := filepath.Join("..", "..", tree)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			checked++
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
				if lines > maxLines {
					rel, _ := filepath.Rel(filepath.Join("..", ".."), path)
					t.Errorf("%s: %s is %d lines (limit %d): split it into named steps", rel, name(fn), lines, maxLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", tree, err)
		}
	}
	if checked == 0 {
		t.Fatal("no Go files found: the trees moved?")
	}
}

// name gives a function's name with its receiver type, as a reader searches for it.
func name(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if idx, ok := typ.(*ast.IndexExpr); ok {
		typ = idx.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
