package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// words splits an identifier into lower-case words at case changes, digits
// and underscores: "LeaseID" → lease id, "EventReleased" → event released.
func words(name string) string {
	var b strings.Builder
	prevLower := false
	for i, r := range name {
		upper := unicode.IsUpper(r)
		switch {
		case r == '_':
			b.WriteByte(' ')
			prevLower = false
			continue
		case upper && (prevLower || (i+1 < len(name) && unicode.IsLower(rune(name[i+1])) && i > 0 && unicode.IsUpper(rune(name[i-1])))):
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(r))
		prevLower = unicode.IsLower(r) || unicode.IsDigit(r)
	}
	return " " + b.String() + " "
}

// leaseIdent matches (the words of) identifiers that name an etcd lease id or
// a lease RPC type; C4's "lease expired" vocabulary is fine.
var leaseIdent = regexp.MustCompile(` lease (id|grant|revoke|keep|time|ttl) | lease $`)

// spiWord matches backend vocabulary that must not appear in the SPI package
// at all.
var spiWord = regexp.MustCompile(` (lease|leases|sql|pgx|etcd|revision|row) `)

// allowed packages may mention leases in exported signatures.
var allowed = []string{"store/etcdstore"}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", dir, err)
	}
	return dir
}

// violations parses every non-test Go file under root and lists exported
// declarations whose names or signatures mention a lease id (anywhere but
// the allowed packages) or any backend word (in the store package).
func violations(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		pkgDir := filepath.ToSlash(filepath.Dir(rel))
		if slices.Contains(allowed, pkgDir) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		re := leaseIdent
		if pkgDir == "store" {
			re = spiWord
		}
		for _, name := range exportedMentions(f) {
			if re.MatchString(words(name)) {
				out = append(out, fmt.Sprintf("%s: exported API mentions %q", rel, name))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

// exportedMentions returns every identifier that appears in an exported
// declaration's name or signature: names, field names, parameter names and
// the type names they use.
func exportedMentions(f *ast.File) []string {
	var names []string
	collect := func(n ast.Node) {
		if n == nil {
			return
		}
		ast.Inspect(n, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.Ident:
				names = append(names, x.Name)
			case *ast.BlockStmt:
				return false // bodies are not the API
			}
			return true
		})
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv != nil && len(d.Recv.List) > 0 && !exportedRecv(d.Recv.List[0].Type) {
				continue
			}
			names = append(names, d.Name.Name)
			collect(d.Type)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					names = append(names, s.Name.Name)
					collect(exportedPart(s.Type))
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							names = append(names, n.Name)
							collect(s.Type)
						}
					}
				}
			}
		}
	}
	return names
}

func exportedRecv(e ast.Expr) bool {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

// exportedPart drops unexported struct fields and interface methods.
func exportedPart(e ast.Expr) ast.Node {
	switch x := e.(type) {
	case *ast.StructType:
		fl := &ast.FieldList{}
		for _, f := range x.Fields.List {
			if len(f.Names) == 0 || slices.ContainsFunc(f.Names, func(n *ast.Ident) bool { return n.IsExported() }) {
				fl.List = append(fl.List, f)
			}
		}
		return fl
	case *ast.InterfaceType:
		fl := &ast.FieldList{}
		for _, f := range x.Methods.List {
			if len(f.Names) == 0 || f.Names[0].IsExported() {
				fl.List = append(fl.List, f)
			}
		}
		return fl
	}
	return e
}

// TestNoLeaseOutsideEtcdstore is the seed's acceptance criterion 7: no lease
// id appears in any exported signature outside store/etcdstore, and the SPI
// package uses no backend vocabulary at all.
func TestNoLeaseOutsideEtcdstore(t *testing.T) {
	if v := violations(t, moduleRoot(t)); len(v) > 0 {
		t.Fatalf("backend vocabulary outside store/etcdstore:\n%s", strings.Join(v, "\n"))
	}
}

// TestCheckerCatchesLeaks proves the check can fail: a synthetic module with
// a lease id in an exported signature and a lease in the SPI is flagged.
func TestCheckerCatchesLeaks(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module x\n")
	write("server/s.go", "package server\ntype Handle struct{ LeaseID int64 }\nfunc Keep(leaseID int64) {}\nfunc ok() { var leaseID int64; _ = leaseID }\nconst EventReleased, LostLeaseExpired = 1, 2\n")
	write("store/s.go", "package store\ntype Session struct{ Lease int64 }\n")
	write("store/etcdstore/e.go", "package etcdstore\nfunc Grant() (leaseID int64) { return 0 }\n")
	v := violations(t, root)
	want := []string{
		`server/s.go: exported API mentions "LeaseID"`,
		`server/s.go: exported API mentions "leaseID"`,
		`store/s.go: exported API mentions "Lease"`,
	}
	if !slices.Equal(v, want) {
		t.Fatalf("violations = %q, want %q", v, want)
	}
}

func TestWords(t *testing.T) {
	for in, want := range map[string]string{
		"LeaseID": " lease id ", "leaseID": " lease id ", "EventReleased": " event released ",
		"LostLeaseExpired": " lost lease expired ", "lease_id": " lease id ", "HTTPServer": " http server ",
	} {
		if got := words(in); got != want {
			t.Errorf("words(%q) = %q, want %q", in, got, want)
		}
	}
}
