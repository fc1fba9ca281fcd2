package etcdstore

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

// TestHeldRange: the held index's range (heldRange) holds every key of the
// spaces it keeps, and of the spaces it knowingly skips, and nothing of any
// other space of keys.go. A new space that sorts inside the range fails
// here until it is named in heldSpaces or heldSkipped (issue 22: the range
// was the literal [P l/, P t), which a new space would have joined
// silently).
func TestHeldRange(t *testing.T) {
	s := &Store{prefix: "/lockd/"}
	from, end := s.heldRange()
	in := func(k string) bool { return from <= k && k < end }
	for _, sp := range keySpaces {
		want := slices.Contains(heldSpaces, sp) || slices.Contains(heldSkipped, sp)
		// The space's first key and keys deep inside it.
		for _, k := range []string{s.prefix + sp, s.prefix + sp + "a/b\x00" + "ZZZZ", s.prefix + sp + "\x7f\x7f\x7f"} {
			if got := in(k); got != want {
				t.Errorf("key %q of space %q in the held range [%q, %q): %v; want %v (name the space in heldSpaces or heldSkipped)",
					k, sp, from, end, got, want)
			}
		}
	}
	for _, sp := range append(slices.Clone(heldSpaces), heldSkipped...) {
		if !slices.Contains(keySpaces, sp) {
			t.Errorf("held space %q is not in keySpaces", sp)
		}
	}
	// The index reads the keys it keeps back from the range.
	if _, ok := s.recordID([]byte(s.recordKey("id"))); !ok {
		t.Errorf("recordID(recordKey) not ok")
	}
	if !s.isSlotKey([]byte(s.slotKey("k", "id"))) || s.isSlotKey([]byte(s.mwaiterKey("k", "id"))) {
		t.Errorf("isSlotKey tells slots from waiters wrongly")
	}
	for _, k := range []string{s.lockKey("k"), s.slotKey("k", "id"), s.recordKey("id")} {
		if !in(k) {
			t.Errorf("%q, which the index keeps, is outside the held range [%q, %q)", k, from, end)
		}
	}
	for _, k := range []string{s.holderKey("id"), s.valueKey("k"), s.delayKey("k"), s.companionKey("id", 1000), s.prefix + epochName} {
		if in(k) {
			t.Errorf("%q is inside the held range [%q, %q)", k, from, end)
		}
	}
}

// layoutLine is one space of the package doc's key layout: "//	P <space>...".
var layoutLine = regexp.MustCompile(`^//\tP ([a-z]+/?)`)

// TestKeyLayoutDoc: the package doc's "Key layout" names exactly the spaces
// of keys.go (issue 22: it omitted m/, d/ and c/), and no file but keys.go
// builds or parses a key from a space literal (s.prefix + "x/").
func TestKeyLayoutDoc(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var inDoc []string
	for _, line := range strings.Split(string(doc), "\n") {
		if m := layoutLine.FindStringSubmatch(line); m != nil && !slices.Contains(inDoc, m[1]) {
			inDoc = append(inDoc, m[1])
		}
	}
	if want := slices.Sorted(slices.Values(keySpaces)); !slices.Equal(slices.Sorted(slices.Values(inDoc)), want) {
		t.Errorf("doc.go's key layout names the spaces %q; keys.go has %q", inDoc, want)
	}

	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "keys.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			be, ok := n.(*ast.BinaryExpr)
			if !ok || be.Op != token.ADD {
				return true
			}
			sel, ok := be.X.(*ast.SelectorExpr)
			lit, isLit := be.Y.(*ast.BasicLit)
			if ok && sel.Sel.Name == "prefix" && isLit && lit.Kind == token.STRING {
				v, _ := strconv.Unquote(lit.Value)
				t.Errorf("%s: a key built from the literal %q outside keys.go", fset.Position(be.Pos()), v)
			}
			return true
		})
	}
}
