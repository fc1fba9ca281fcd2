package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestSessionsCmd: `lockd sessions` lists the live sessions (every one, on
// a server without a policy) with owner, TTL, time left and lock count, as
// text and as JSON.
func TestSessionsCmd(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s1, err := srv.Client.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s1.Close(context.Background())
		if _, err := s1.Acquire(ctx, "sess/a"); err != nil {
			t.Fatal(err)
		}
		s2, err := srv.Client.NewSession(ctx, client.WithOwner("batch-7", map[string]string{"team": "ops"}))
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close(context.Background())

		res := lockd(t, environ, "sessions")
		for _, want := range []string{"SESSION", "LOCKS", s1.ID(), s2.ID(), "batch-7"} {
			if res.code != 0 || !strings.Contains(res.stdout, want) {
				t.Errorf("sessions: %v\nwant %q", res, want)
			}
		}
		res = lockd(t, environ, "sessions", "-o", "json")
		var got []sessionJSON
		if err := json.Unmarshal([]byte(res.stdout), &got); res.code != 0 || err != nil {
			t.Fatalf("sessions -o json: %v (%v)", res, err)
		}
		byID := map[string]sessionJSON{}
		for _, s := range got {
			byID[s.Session] = s
			if s.RemainingMs <= 0 || s.RemainingMs > s.TTLMs {
				t.Errorf("session %+v: remaining_ms not in (0, ttl_ms]", s)
			}
		}
		if s, ok := byID[s1.ID()]; !ok || s.Locks != 1 {
			t.Errorf("sessions -o json = %+v; want the holder's session with 1 lock", got)
		}
		if s, ok := byID[s2.ID()]; !ok || s.Owner != "batch-7" || s.Labels["team"] != "ops" || s.Locks != 0 {
			t.Errorf("sessions -o json = %+v; want %s with owner batch-7, label team=ops, 0 locks", got, s2.ID())
		}
	})
}
