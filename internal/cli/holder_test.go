package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestHolderShown: issue #15 §1 in the CLI. inspect (text and JSON) and ls
// show the holder's owner, labels and value; lockd run's waiting line names
// the holder; lockd run's own session carries "host (pid N, cmd)" unless
// --owner says otherwise.
func TestHolderShown(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s, err := srv.Client.NewSession(ctx, client.WithOwner("web-3 (pid 812, deploy/api)", map[string]string{"job": "deploy/api"}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		l, err := s.Acquire(ctx, "h/a", client.WithValue([]byte("leader-1")))
		if err != nil {
			t.Fatal(err)
		}

		res := lockd(t, environ, "inspect", "h/a")
		for _, want := range []string{
			"holder:    held by web-3 (pid 812, deploy/api) token " + itoa(l.Token()) + " for ",
			"owner:     web-3 (pid 812, deploy/api)\n", "labels:    job=deploy/api\n", "value:     leader-1\n",
		} {
			if res.code != 0 || !strings.Contains(res.stdout, want) {
				t.Errorf("inspect h/a: %v\nwant %q", res, want)
			}
		}
		res = lockd(t, environ, "inspect", "-o", "json", "h/a")
		var one lockJSON
		if err := json.Unmarshal([]byte(res.stdout), &one); err != nil || res.code != 0 {
			t.Fatalf("inspect -o json: %v (%v)", res, err)
		}
		if one.Owner != "web-3 (pid 812, deploy/api)" || one.Labels["job"] != "deploy/api" || string(one.Value) != "leader-1" {
			t.Errorf("inspect -o json = %+v", one)
		}
		res = lockd(t, environ, "ls", "h/")
		if lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n"); res.code != 0 || len(lines) != 2 ||
			!strings.HasSuffix(lines[1], "web-3 (pid 812, deploy/api)") {
			t.Errorf("ls h/: %v; want the owner in the row", res)
		}

		// A waiting lockd run names the holder; once it holds the key, its
		// own default owner shows.
		r := start(t, environ, "run", "h/a", "--", "sleep", "30")
		testkit.Eventually(t, 30*time.Second, "run's waiting line", func() bool {
			return strings.Contains(r.stderr.String(), `lockd run: waiting for "h/a": held by web-3 (pid 812, deploy/api) token `+itoa(l.Token()))
		})
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		host, _ := os.Hostname()
		want := fmt.Sprintf("%s (pid %d, sleep)", host, os.Getpid())
		testkit.Eventually(t, 30*time.Second, "run's default owner in inspect", func() bool {
			info, err := srv.Client.Inspect(ctx, "h/a")
			return err == nil && info.Held && info.Owner == want
		})
		r.stop(t, 30*time.Second)
	})
}

// TestOwnerText: owners are shown like keys (no terminal escapes reach the
// terminal), and lockd run's default owner is printable and bounded.
func TestOwnerText(t *testing.T) {
	t.Parallel()
	info := client.LockInfo{Held: true, Token: 7, Owner: `we"b`, AcquiredAt: time.Now()}
	if got := heldBy(info, info.AcquiredAt); got != `held by "we\"b" token 7 for 0s` {
		t.Errorf("heldBy(quoted owner) = %q", got)
	}
	if got := heldBy(client.LockInfo{Held: true, Token: 7}, time.Now()); got != "held by token 7 for 0s" {
		t.Errorf("heldBy(no owner) = %q", got)
	}
	if got := sanitizeOwner("a\x1b[2J\nb" + strings.Repeat("é", 100)); strings.ContainsAny(got, "\x1b\n") || len(got) > 128 {
		t.Errorf("sanitizeOwner = %q (%d bytes)", got, len(got))
	}
	if got := displayLabels(map[string]string{"b": "2", "a": "x\x1by"}); got != `a="x\x1by" b=2` {
		t.Errorf("displayLabels = %q", got)
	}
}
