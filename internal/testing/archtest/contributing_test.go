package archtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mapEntry is a line of CONTRIBUTING.md's "Where things live" map: a list
// item that starts with a path in backquotes.
var mapEntry = regexp.MustCompile("(?m)^- `([^`]+)`")

// TestContributingMap (issue 22): a newcomer reading CONTRIBUTING.md's map
// finds every Go package of the module in it, and every path the map names
// exists.
func TestContributingMap(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range mapEntry.FindAllStringSubmatch(string(doc), -1) {
		listed[m[1]] = true
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			t.Errorf("CONTRIBUTING.md's map names %s, which does not exist", m[1])
		}
	}
	cmd := exec.Command(goCommand(t), "list", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderrOf(err))
	}
	for _, pkg := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, "lock.dev/lockd"), "/")
		if rel == "" {
			continue
		}
		if !listed[rel] {
			t.Errorf("package %s is not in CONTRIBUTING.md's map (a line \"- `%s` — …\")", pkg, rel)
		}
	}
}
