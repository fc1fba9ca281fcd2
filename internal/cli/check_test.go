package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestCheck: lockd check KEY TOKEN exits 0 for the holder's token, 3 for
// a token superseded by a re-grant and for a key nobody holds (C2
// #ct2-check-token), prints which, and refuses a token that is not one.
func TestCheck(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		l1 := hold(t, srv.Client, "chk/a")
		if res := lockd(t, environ, "check", "chk/a", itoa(l1.Token())); res.code != 0 || res.stdout != "current: chk/a token "+itoa(l1.Token())+"\n" {
			t.Fatalf("check of the holder's token: %v", res)
		}
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := hold(t, srv.Client, "chk/a")
		res := lockd(t, environ, "check", "chk/a", itoa(l1.Token()))
		if res.code != ExitStale || res.stdout != "stale: chk/a is held with token "+itoa(l2.Token())+"\n" {
			t.Fatalf("check of a superseded token: %v; want exit %d naming token %d", res, ExitStale, l2.Token())
		}
		testkit.Eventually(t, 10*time.Second, "lockd check --cached to see the re-grant", func() bool {
			res := lockd(t, environ, "check", "--cached", "-o", "json", "chk/a", itoa(l1.Token()))
			var out struct {
				Current bool     `json:"current"`
				Tokens  []string `json:"tokens"`
			}
			return res.code == ExitStale && json.Unmarshal([]byte(res.stdout), &out) == nil && !out.Current &&
				len(out.Tokens) == 1 && out.Tokens[0] == itoa(l2.Token())
		})
		if res := lockd(t, environ, "check", "chk/never", "12"); res.code != ExitStale || res.stdout != "stale: chk/never is not held\n" {
			t.Fatalf("check of a free key: %v", res)
		}
		for _, bad := range []string{"0", "x", "18446744073709551616"} {
			if res := lockd(t, environ, "check", "chk/a", bad); res.code != ExitUsage || !strings.Contains(res.stderr, "TOKEN") {
				t.Errorf("check with token %q: %v; want a usage error", bad, res)
			}
		}
	})
}
