package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestRunWaitEstimate: lockd run's waiting line shows the server's wait
// estimate (C2 #ct2-wait-estimate) once holds of the key were observed, and
// none before.
func TestRunWaitEstimate(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx := testkit.Context(t, 60*time.Second)
		l := hold(t, srv.Client, "eta/k")
		res := lockd(t, environ, "run", "--wait", "700ms", "eta/k", "--", "true")
		if !strings.Contains(res.stderr, `waiting for "eta/k": held by token `) || strings.Contains(res.stderr, "estimated") {
			t.Errorf("with no hold observed: want a waiting line without an estimate:\n%s", res.stderr)
		}
		// Two holds of about 200 ms (the test's input, not a
		// synchronisation).
		for range 2 {
			<-time.After(200 * time.Millisecond)
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			l = hold(t, srv.Client, "eta/k")
		}
		r := start(t, environ, "run", "eta/k", "--", "true")
		re := regexp.MustCompile(`waiting for "eta/k": held by token \d+ for \S+, queue position 1 of 1, estimated (\d+\.\d)s`)
		testkit.Eventually(t, 30*time.Second, "run's waiting line with an estimate", func() bool {
			return re.MatchString(r.stderr.String())
		})
		// lockd inspect shows it too, in text and JSON.
		res = lockd(t, environ, "inspect", "eta/k")
		if !regexp.MustCompile(`\n  1\. \S+\n     estimated wait \d+\.\ds \(not a promise\)\n`).MatchString(res.stdout) {
			t.Errorf("inspect eta/k: want the waiter's estimate:\n%s", res.stdout)
		}
		res = lockd(t, environ, "inspect", "-o", "json", "eta/k")
		var one lockJSON
		if err := json.Unmarshal([]byte(res.stdout), &one); err != nil || len(one.WaitEstimates) != 1 ||
			one.WaitEstimates[0].Position != 1 || one.WaitEstimates[0].Session != one.Waiters[0] {
			t.Errorf("inspect -o json eta/k: %v (%v); want one wait estimate, position 1, of the waiter", res.stdout, err)
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if res := r.wait(t, 30*time.Second); res.code != 0 {
			t.Errorf("lockd run after the release: %v", res)
		}
	})
}

// TestWaitingLine: the waiting line of each kind of wait update (C2
// #ct2-wait-updates): a refused read says so rather than blaming the server.
func TestWaitingLine(t *testing.T) {
	held := client.LockInfo{Key: "k", Held: true, Token: 7} // no AcquiredAt: held for 0s
	for _, tc := range []struct {
		u    client.WaitUpdate
		want string
	}{
		{client.WaitUpdate{Key: "k", Err: fmt.Errorf("inspect: %w", client.ErrPermissionDenied)},
			`lockd run: waiting for "k" (no queue position: not allowed to read the key)`},
		{client.WaitUpdate{Key: "k", Err: client.ErrUnavailable}, `lockd run: waiting for "k" (holder unknown: server not answering)`},
		{client.WaitUpdate{Key: "k", Info: client.LockInfo{Key: "k"}}, `lockd run: waiting for "k": being handed over`},
		{client.WaitUpdate{Key: "k", Position: 2, Waiters: 3, Info: held}, `lockd run: waiting for "k": held by token 7 for 0s, queue position 2 of 3`},
		{client.WaitUpdate{Key: "k", Position: 1, Waiters: 1, Info: held, HasEstimate: true, Estimate: 1500 * time.Millisecond},
			`lockd run: waiting for "k": held by token 7 for 0s, queue position 1 of 1, estimated 1.5s`},
	} {
		if got := waitingLine("lockd run", "k", tc.u); got != tc.want {
			t.Errorf("waitingLine(%+v) = %q; want %q", tc.u, got, tc.want)
		}
	}
}
