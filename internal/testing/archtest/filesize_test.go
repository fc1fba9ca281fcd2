package archtest

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFileLines bounds a non-test, non-generated Go file of the trees in
// sizeCapped (issue 22: a file a reader can hold in mind).
const maxFileLines = 500

// sizeCapped are the trees whose files maxFileLines bounds, relative to the
// module root (issue 22: the longest file in client/, server/ and store/).
var sizeCapped = []string{"client", "server", "store"}

// TestFileSizes fails for every non-test, non-generated Go file under
// sizeCapped longer than maxFileLines lines.
func TestFileSizes(t *testing.T) {
	root := moduleRoot(t)
	files := 0
	for _, tree := range sizeCapped {
		err := filepath.WalkDir(filepath.Join(root, tree), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.HasPrefix(b, []byte("// Code generated ")) {
				return nil
			}
			files++
			if n := bytes.Count(b, []byte("\n")); n > maxFileLines {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s has %d lines, at most %d allowed: split it by responsibility", rel, n, maxFileLines)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walking %s: %v", tree, err)
		}
	}
	if files == 0 {
		t.Fatalf("no Go file found under %v: the check would be blind", sizeCapped)
	}
}
