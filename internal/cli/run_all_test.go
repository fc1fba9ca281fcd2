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

// TestRunSeveralKeys: `lockd run --all K1 K2 -- CMD` holds both keys while
// CMD runs and gives CMD every key and token (C5 #ct5-run-keys); a --wait 0
// run of an overlapping set exits 80 and holds nothing; both keys are free
// after CMD; without --all, `lockd run K cmd -- x` still takes only K and
// runs `cmd -- x`.
func TestRunSeveralKeys(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx := context.Background()
		dir := t.TempDir()
		goFile, envFile := filepath.Join(dir, "go"), filepath.Join(dir, "env")
		script := fmt.Sprintf(`env | grep '^LOCKD_' | sort > %s.tmp; mv %s.tmp %s; while [ ! -e %s ]; do sleep 0.05; done`,
			envFile, envFile, envFile, goFile)
		run := start(t, environ, "run", "--all", "all/b", "all/a", "--", "sh", "-c", script)
		testkit.Eventually(t, 30*time.Second, "the command runs", func() error {
			_, err := os.Stat(envFile)
			return err
		})
		b, err := os.ReadFile(envFile)
		if err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{}
		for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			k, v, _ := strings.Cut(line, "=")
			vars[k] = v
		}
		tokens := map[string]string{}
		for i, key := range []string{"all/b", "all/a"} {
			info, err := srv.Client.Inspect(ctx, key)
			if err != nil || !info.Held {
				t.Fatalf("Inspect(%s) while CMD runs = %+v, %v; want held", key, info, err)
			}
			n := fmt.Sprint(i + 1)
			tokens[n] = fmt.Sprint(info.Token)
			if vars["LOCKD_KEY_"+n] != key || vars["LOCKD_FENCING_TOKEN_"+n] != tokens[n] {
				t.Errorf("CMD's LOCKD_KEY_%s=%q LOCKD_FENCING_TOKEN_%s=%q; want %q and %s", n, vars["LOCKD_KEY_"+n], n, vars["LOCKD_FENCING_TOKEN_"+n], key, tokens[n])
			}
		}
		if vars["LOCKD_KEY_COUNT"] != "2" || vars["LOCKD_FENCING_TOKENS"] != tokens["1"]+" "+tokens["2"] {
			t.Errorf("CMD's environment %v; want LOCKD_KEY_COUNT=2 and LOCKD_FENCING_TOKENS=%q", vars, tokens["1"]+" "+tokens["2"])
		}
		if _, ok := vars["LOCKD_KEY"]; ok {
			t.Errorf("CMD's environment has LOCKD_KEY=%q with --all; want it unset", vars["LOCKD_KEY"])
		}
		// An overlapping set with --wait 0: locked, and nothing taken.
		if res := lockd(t, environ, "run", "--all", "--wait", "0", "all/c", "all/a", "--", "true"); res.code != ExitLocked {
			t.Errorf("lockd run --all --wait 0 of an overlapping set: %v; want exit %d", res, ExitLocked)
		}
		if info, err := srv.Client.Inspect(ctx, "all/c"); err != nil || info.Held {
			t.Errorf("all/c after the refused run = %+v, %v; want free", info, err)
		}
		if err := os.WriteFile(goFile, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if res := run.wait(t, 30*time.Second); res.code != 0 {
			t.Fatalf("lockd run --all: %v", res)
		}
		for _, key := range []string{"all/a", "all/b"} {
			if info, err := srv.Client.Inspect(ctx, key); err != nil || info.Held {
				t.Errorf("Inspect(%s) after the run = %+v, %v; want free", key, info, err)
			}
		}
		// Without --all the old reading holds: one key, CMD "sh -c ... -- x".
		res := lockd(t, environ, "run", "old/k", "sh", "-c", `echo "$LOCKD_KEY $LOCKD_KEY_COUNT $0 $1"`, "--", "x")
		if res.code != 0 || res.stdout != "old/k  -- x\n" {
			t.Errorf("lockd run old/k sh -c ... -- x: %v; want one key old/k and CMD's arguments \"-- x\"", res)
		}
	})
}

func TestRunSeveralKeysUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--all", "a", "b", "true"}, `no "--"`},
		{[]string{"run", "--all", "--", "true"}, `no "--"`}, // cobra takes a "--" before any key
		{[]string{"run", "--all", "a", "b", "--"}, "got no CMD"},
		{[]string{"run", "--all", "a", "a", "--", "true"}, "given twice"},
		{[]string{"run", "--all", "--limit", "2", "a", "--", "true"}, "do not combine with --all"},
		{[]string{"run", "--all", "--lock-delay", "1s", "a", "--", "true"}, "do not combine with --all"},
	} {
		res := lockd(t, nil, tt.args...)
		if res.code != ExitUsage || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("lockd %q: %v\nwant exit 2 and %q", tt.args, res, tt.want)
		}
	}
}
