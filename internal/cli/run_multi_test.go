package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestRunLimitAndShared: two `lockd run --limit 2` hold KEY at once, a third
// is locked out, a run with another limit is refused; two `--shared` runs
// hold together and an `--exclusive` one is locked out.
func TestRunLimitAndShared(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		for _, tc := range []struct {
			name, key string
			flags     []string // of the two holders
			out       []string // of the run that is locked out
			other     []string // of a run of another kind: refused
		}{
			{"limit", "multi/sem", []string{"--limit", "2"}, []string{"--limit", "2"}, []string{"--limit", "3"}},
			{"shared", "multi/rw", []string{"--shared"}, []string{"--exclusive"}, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				goFile := filepath.Join(dir, "go")
				// Each holder marks that it runs, then waits to be let go.
				script := fmt.Sprintf(`touch %s/run.$LOCKD_FENCING_TOKEN; while [ ! -e %s ]; do sleep 0.05; done`, dir, goFile)
				var runs []*running
				for range 2 {
					args := append(append([]string{"run"}, tc.flags...), tc.key, "--", "sh", "-c", script)
					runs = append(runs, start(t, environ, args...))
				}
				testkit.Eventually(t, 30*time.Second, "both holders run at once", func() error {
					m, _ := filepath.Glob(filepath.Join(dir, "run.*"))
					if len(m) != 2 {
						return fmt.Errorf("%d running", len(m))
					}
					return nil
				})
				info, err := srv.Client.Inspect(context.Background(), tc.key)
				if err != nil || len(info.Holders) != 2 {
					t.Fatalf("Inspect = %+v, %v; want two holders", info, err)
				}
				args := append(append([]string{"run", "--wait", "0"}, tc.out...), tc.key, "--", "true")
				if res := lockd(t, environ, args...); res.code != ExitLocked {
					t.Errorf("lockd %q: %v; want exit %d", args, res, ExitLocked)
				}
				for _, other := range [][]string{tc.other, {}} { // {}: a plain run
					if other == nil {
						continue
					}
					args := append(append([]string{"run"}, other...), tc.key, "--", "true")
					res := lockd(t, environ, args...)
					if res.code != 1 || !strings.Contains(res.stderr, "mismatch") {
						t.Errorf("lockd %q: %v; want exit 1 naming the mismatch", args, res)
					}
				}
				if err := os.WriteFile(goFile, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				for i, r := range runs {
					if res := r.wait(t, 30*time.Second); res.code != 0 {
						t.Errorf("holder %d: %v", i, res)
					}
				}
			})
		}
	})
}

func TestRunLimitUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--shared", "--exclusive", "k", "true"}, "exclude each other"},
		{[]string{"run", "--shared", "--limit", "3", "k", "true"}, "does not combine"},
		{[]string{"run", "--limit", "5000", "k", "true"}, "at most 1024"},
		{[]string{"run", "--limit", "2", "--lock-delay", "1s", "k", "true"}, "plain locks only"},
		{[]string{"run", "--shared", "--max-hold", "1m", "k", "true"}, "plain locks only"},
	} {
		res := lockd(t, nil, tt.args...)
		if res.code != ExitUsage || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("lockd %q: %v\nwant exit 2 and %q", tt.args, res, tt.want)
		}
	}
}
