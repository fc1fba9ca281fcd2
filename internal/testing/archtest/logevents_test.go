package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLogEventsInContract (C4 #ct4-logs: never log an event the contract
// lacks): every slog message that lockd's own code writes — the message
// argument of a slog Logger's Debug/Info/Warn/Error/Log/LogAttrs call, or of
// telemetry.Log's info/warn helpers, given as a string literal or a constant
// of the telemetry package — is an event named in the first column of a
// table of docs/contracts/C4.md. On the code before this test, etcd's
// max-hold revoke logged "max-hold revoke failed", which C4 did not list.
// Test files, the SDKs' code (client/, which logs nothing of lockd's
// contract) and generated code are not read.
func TestLogEventsInContract(t *testing.T) {
	root := moduleRoot(t)
	c4, err := os.ReadFile(filepath.Join(root, "docs/contracts/C4.md"))
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9_]+)` \\|").FindAllSubmatch(c4, -1) {
		events[string(m[1])] = true
	}
	if len(events) < 20 {
		t.Fatalf("read %d events from C4's tables; want the whole list (is the table format still `| `event` | level | fields |`?)", len(events))
	}

	consts := telemetryConstants(t, root)
	var found, unknown []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case strings.HasPrefix(d.Name(), ".") && rel != ".",
				d.Name() == "testdata", d.Name() == "node_modules",
				rel == "sdk", rel == "client", rel == "test", rel == "proto", rel == "internal/testing":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			var arg ast.Expr
			switch sel.Sel.Name {
			case "Debug", "Info", "Warn", "Error", "info", "warn":
				if len(call.Args) >= 1 {
					arg = call.Args[0]
				}
			case "DebugContext", "InfoContext", "WarnContext", "ErrorContext":
				if len(call.Args) >= 2 {
					arg = call.Args[1]
				}
			case "Log", "LogAttrs":
				if len(call.Args) >= 3 {
					arg = call.Args[2]
				}
			}
			msg, ok := messageOf(arg, consts)
			if !ok {
				return true
			}
			where := rel + ":" + strconv.Itoa(fset.Position(call.Pos()).Line)
			found = append(found, where)
			if !events[msg] {
				unknown = append(unknown, where+": "+strconv.Quote(msg))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 10 {
		t.Fatalf("found %d log calls with a literal message; want lockd's own (is the scan still reading server/, store/, internal/?)", len(found))
	}
	slices.Sort(unknown)
	for _, u := range unknown {
		t.Errorf("%s is not an event of docs/contracts/C4.md (add it to the contract first, or log a listed event)", u)
	}
}

// messageOf is the message e names: a string literal, or a constant of the
// telemetry package (telemetry.EventX, or EventX inside that package).
func messageOf(e ast.Expr, consts map[string]string) (string, bool) {
	switch v := e.(type) {
	case *ast.BasicLit:
		if v.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(v.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[v.Name]
		return s, ok
	case *ast.SelectorExpr:
		if x, ok := v.X.(*ast.Ident); ok && x.Name == "telemetry" {
			s, ok := consts[v.Sel.Name]
			return s, ok
		}
	}
	return "", false
}

// telemetryConstants are the string constants of internal/telemetry.
func telemetryConstants(t *testing.T, root string) map[string]string {
	t.Helper()
	consts := map[string]string{}
	dir := filepath.Join(root, "internal/telemetry")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[n.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
		}
	}
	return consts
}
