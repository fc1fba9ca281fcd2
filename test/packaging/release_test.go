package packaging

import (
	"debug/elf"
	"encoding/json"
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestReleaseBuild: the host target built with make release's flags is a
// static, stripped binary whose lockd version shows the stamped values.
// (make release cross-builds linux/amd64 and linux/arm64 the same way; it
// is not run here: the arm64 build adds minutes.)
func TestReleaseBuild(t *testing.T) {
	bin := lockdBinary(t)
	out, err := run(t, "", lockdEnv(), bin, "version", "-o", "json")
	if err != nil {
		t.Fatalf("lockd version: %v\n%s", err, out)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("lockd version -o json: %v in %q", err, out)
	}
	want := map[string]string{"version": stampVersion, "commit": stampCommit, "modified": stampModified,
		"go": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH}
	for k, w := range want {
		if v[k] != w {
			t.Errorf("lockd version: %s = %q, want %q", k, v[k], w)
		}
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("release binary is not ELF: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("release binary has a program interpreter: not static (CGO_ENABLED=0)")
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("release binary has a symbol table: not stripped (-s)")
	}
	// -trimpath: no path of this checkout in the binary.
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), repoRoot+"/") {
		t.Errorf("release binary contains the build path %s: not built with -trimpath", repoRoot)
	}
}
