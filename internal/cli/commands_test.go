package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestInspectLsRevoke checks the read commands in text and JSON, and revoke.
func TestInspectLsRevoke(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		held := hold(t, srv.Client, "app/a")
		hold(t, srv.Client, "app/b")
		hold(t, srv.Client, "other")
		// A waiter queued on app/a.
		ws, err := srv.Client.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close(context.Background())
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		waited := make(chan error, 1)
		go func() { _, err := ws.Acquire(wctx, "app/a"); waited <- err }() // ends at wcancel or grant
		defer func() { wcancel(); <-waited }()
		testkit.Eventually(t, 30*time.Second, "the waiter to queue", func() bool {
			info, err := srv.Client.Inspect(ctx, "app/a")
			return err == nil && len(info.Waiters) == 1
		})

		res := lockd(t, environ, "inspect", "app/a")
		for _, want := range []string{"key:       app/a\n", "held:      yes\n", "token:     " + itoa(held.Token()) + "\n",
			"held for:  ", "waiters:   1\n", "  1. " + ws.ID() + "\n"} {
			if res.code != 0 || !strings.Contains(res.stdout, want) {
				t.Errorf("inspect app/a: %v\nwant %q", res, want)
			}
		}
		res = lockd(t, environ, "inspect", "--output", "json", "app/a")
		var one lockJSON
		if err := json.Unmarshal([]byte(res.stdout), &one); err != nil || res.code != 0 {
			t.Fatalf("inspect -o json: %v (%v)", res, err)
		}
		if one.Key != "app/a" || !one.Held || one.Token != held.Token() || one.AcquiredAt == nil ||
			len(one.Waiters) != 1 || one.Waiters[0] != ws.ID() || one.HeldForMs < 0 {
			t.Errorf("inspect -o json = %+v", one)
		}
		res = lockd(t, environ, "inspect", "-o", "json", "nobody")
		if res.code != 0 || strings.TrimSpace(res.stdout) != `{"key":"nobody","held":false,"waiters":[]}` {
			t.Errorf("inspect -o json of a free key: %v", res)
		}
		if res := lockd(t, environ, "inspect", "nobody"); res.code != 0 || !strings.Contains(res.stdout, "held:      no\n") {
			t.Errorf("inspect of a free key: %v", res)
		}

		res = lockd(t, environ, "ls", "app/")
		lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		if res.code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "KEY TOKEN HELD FOR WAITERS MODE OWNER" {
			t.Fatalf("ls app/: %v", res)
		}
		if f := strings.Fields(lines[1]); f[0] != "app/a" || f[1] != itoa(held.Token()) || f[3] != "1" {
			t.Errorf("ls row %q, want app/a, token %d, 1 waiter", lines[1], held.Token())
		}
		if f := strings.Fields(lines[2]); f[0] != "app/b" || f[3] != "0" {
			t.Errorf("ls row %q, want app/b with 0 waiters", lines[2])
		}
		res = lockd(t, environ, "ls", "-o", "json")
		var all []lockJSON
		if err := json.Unmarshal([]byte(res.stdout), &all); err != nil || res.code != 0 {
			t.Fatalf("ls -o json: %v (%v)", res, err)
		}
		if len(all) != 3 || all[0].Key != "app/a" || all[1].Key != "app/b" || all[2].Key != "other" {
			t.Errorf("ls -o json keys = %+v, want app/a app/b other", all)
		}
		if res := lockd(t, environ, "ls", "-o", "json", "none/"); res.code != 0 || strings.TrimSpace(res.stdout) != "[]" {
			t.Errorf("ls -o json of nothing: %v", res)
		}

		res = lockd(t, environ, "revoke", "app/b")
		if res.code != 0 || !strings.HasPrefix(res.stdout, "revoked app/b (token ") {
			t.Errorf("revoke app/b: %v", res)
		}
		if res := lockd(t, environ, "revoke", "app/b"); res.code != 0 || res.stdout != "app/b was not held\n" {
			t.Errorf("revoke of a free key: %v", res)
		}
	})
}

func itoa(u uint64) string { return strconv.FormatUint(u, 10) }

// TestWatch prints one line per event, in text and JSON; the server's
// progress messages (one at the start of every stream, C2
// #ct2-watch-progress) are not events and print nothing.
func TestWatch(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		text := start(t, environ, "watch", "w/")
		js := start(t, environ, "watch", "--output", "json", "w/")
		for _, r := range []*running{text, js} {
			testkit.Eventually(t, 30*time.Second, "the watch to be established", func() bool {
				return strings.Contains(r.stderr.String(), `watching "w/"`)
			})
		}
		ctx := context.Background()
		l := hold(t, srv.Client, "w/x")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := hold(t, srv.Client, "w/x")
		hold(t, srv.Client, "not-watched")
		if _, err := srv.Client.Revoke(ctx, "w/x"); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, "four text events", func() bool { return strings.Count(text.stdout.String(), "\n") >= 4 })
		testkit.Eventually(t, 30*time.Second, "four json events", func() bool { return strings.Count(js.stdout.String(), "\n") >= 4 })

		res := text.stop(t, 30*time.Second)
		want := []string{
			"acquired w/x token=" + itoa(l.Token()),
			"released w/x token=" + itoa(l.Token()),
			"acquired w/x token=" + itoa(l2.Token()),
			"revoked  w/x token=" + itoa(l2.Token()),
		}
		lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		if res.code != 0 || len(lines) != len(want) {
			t.Fatalf("watch: %v\nwant %d lines", res, len(want))
		}
		for i, w := range want {
			if !strings.HasPrefix(lines[i], w+" session=") {
				t.Errorf("watch line %d = %q, want %q session=...", i, lines[i], w)
			}
		}

		res = js.stop(t, 30*time.Second)
		var kinds []string
		for _, line := range strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n") {
			var ev eventJSON
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("watch -o json line %q: %v", line, err)
			}
			if ev.Key != "w/x" || ev.Token == 0 || ev.Session == "" {
				t.Errorf("watch -o json event %+v", ev)
			}
			kinds = append(kinds, ev.Kind)
		}
		if got := strings.Join(kinds, " "); got != "acquired released acquired revoked" || res.code != 0 {
			t.Errorf("watch -o json kinds %q (exit %d), want acquired released acquired revoked", got, res.code)
		}
	})
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", "--server", "127.0.0.1:1", "--timeout", "300ms", "k"}, ExitError, "lockd server at 127.0.0.1:1 unavailable"},
		{[]string{"ls", "--server", "127.0.0.1:1", "--timeout", "300ms"}, ExitError, "unavailable"},
		{[]string{"watch", "--server", "127.0.0.1:1", "--timeout", "300ms"}, ExitError, "unavailable"},
		{[]string{"run", "--server", "127.0.0.1:1", "--timeout", "300ms", "k", "true"}, ExitUnavailable, "unavailable"},
		{[]string{"inspect"}, ExitUsage, "want KEY"},
		{[]string{"inspect", "a", "b"}, ExitUsage, "want KEY, got 2"},
		{[]string{"ls", "a", "b"}, ExitUsage, "at most a PREFIX"},
		{[]string{"revoke"}, ExitUsage, "want KEY"},
		{[]string{"inspect", "-o", "yaml", "k"}, ExitUsage, "--output must be text or json"},
		{[]string{"bogus"}, ExitUsage, `unknown command "bogus"`},
		{[]string{}, ExitUsage, "Usage:"},
	}
	for _, tt := range tests {
		res := lockd(t, nil, tt.args...)
		if res.code != tt.code || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("lockd %q: %v\nwant exit %d and %q", tt.args, res, tt.code, tt.want)
		}
	}
	if res := lockd(t, nil, "--help"); res.code != 0 || !strings.Contains(res.stdout, "lockd run KEY -- CMD") {
		t.Errorf("lockd --help: %v", res)
	}
}

// TestServerFromEnv: without --server, client commands use $LOCKD_SERVER.
func TestServerFromEnv(t *testing.T) {
	t.Parallel()
	res := lockd(t, []string{EnvServer + "=127.0.0.1:2"}, "inspect", "--timeout", "200ms", "k")
	if res.code != ExitError || !strings.Contains(res.stderr, "127.0.0.1:2") {
		t.Errorf("inspect with LOCKD_SERVER: %v", res)
	}
}
