package main

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// TestVerdict: a run passes only when a test passed and none failed. A run
// in which -run matched nothing ("ok … [no tests to run]") or every test
// skipped counts as failed: it was counted a pass before, so a stress
// figure could include runs that tested nothing.
func TestVerdict(t *testing.T) {
	lines := func(ls ...string) []byte { return []byte(strings.Join(ls, "\n") + "\n") }
	const (
		start   = `{"Action":"start","Package":"p"}`
		pkgPass = `{"Action":"pass","Package":"p","Elapsed":0.1}`
		pkgFail = `{"Action":"fail","Package":"p","Elapsed":0.1}`
	)
	exit1 := errors.New("exit status 1")
	for _, c := range []struct {
		name string
		out  []byte
		err  error
		want []string
	}{
		{"a test passed", lines(start, `{"Action":"run","Package":"p","Test":"TestA"}`,
			`{"Action":"pass","Package":"p","Test":"TestA"}`, pkgPass), nil, nil},
		{"no test matched -run", lines(start, `{"Action":"output","Package":"p","Output":"testing: warning: no tests to run\n"}`,
			pkgPass), nil, []string{"(no test passed in ./p -run TestX)"}},
		{"every test skipped", lines(start, `{"Action":"run","Package":"p","Test":"TestA"}`,
			`{"Action":"skip","Package":"p","Test":"TestA"}`, pkgPass), nil, []string{"(no test passed in ./p -run TestX)"}},
		{"a test failed", lines(start, `{"Action":"pass","Package":"p","Test":"TestA"}`,
			`{"Action":"fail","Package":"p","Test":"TestB/sub"}`, `{"Action":"fail","Package":"p","Test":"TestB"}`, pkgFail),
			exit1, []string{"TestB/sub", "TestB"}},
		{"the package failed outside a test", lines(start, `{"Action":"pass","Package":"p","Test":"TestA"}`, pkgFail),
			exit1, []string{"(package ./p)"}},
		{"go test failed without output", nil, exit1, []string{"(package ./p)"}},
	} {
		if got := verdict("./p", "TestX", c.out, c.err); !slices.Equal(got, c.want) {
			t.Errorf("%s: verdict = %q, want %q", c.name, got, c.want)
		}
	}
}
