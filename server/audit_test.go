package server_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// closedBy reports whether logs hold a session_closed event of session id
// whose by and rule are the given ones (C4 #ct4-audit).
func closedBy(logs *testkit.LogBuffer, id, by, rule string) func() bool {
	return func() bool {
		return slices.ContainsFunc(logs.Events("session_closed"), func(ev map[string]any) bool {
			b, hasBy := ev["by"]
			r, hasRule := ev["rule"]
			return ev["session"] == id && hasBy && hasRule && b == by && r == rule
		})
	}
}

// TestSessionCloseAudit: every session somebody closes is a session_closed
// event naming who (C4 #ct4-audit): the principal and the rule of a
// CloseSession call, also when lockd retries the close after the backend
// refused it, and an empty by with rule shutdown for the closes lockd
// decides itself (close-sessions-on-shutdown).
func TestSessionCloseAudit(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		az, _ := authFiles(t, matrixPolicy, "locker")
		log, logs := testkit.NewLogger()
		var faulty *lockdtest.Faulty
		wrap := func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Auth: az, NoClient: true, Logger: log, Wrap: wrap})
		api := dial(t, srv.Addr)
		ctx := testCtx(t, time.Minute)
		locker := as(ctx, "locker")

		// A close by the caller: by is its principal, rule the rule
		// that allowed CloseSession.
		id := openRaw(t, locker, api, longTTL).SessionId
		if r, err := api.Acquire(locker, &lockdv1.AcquireRequest{SessionId: id, Key: "a/k"}); err != nil || !r.Granted {
			t.Fatalf("Acquire(a/k) = %v, %v", r, err)
		}
		if _, err := api.CloseSession(locker, &lockdv1.CloseSessionRequest{SessionId: id}); err != nil {
			t.Fatalf("CloseSession: %v", err)
		}
		testkit.Eventually(t, 5*time.Second, "session_closed {by locker, rule lockers}", closedBy(logs, id, "locker", "lockers"))
		for _, ev := range logs.Events("session_closed") {
			if ev["session"] == id && fmt.Sprint(ev["released"]) != "1" {
				t.Errorf("session_closed = %v; want released 1", ev)
			}
		}

		// A close the backend refused is retried by lockd, still in the
		// caller's name.
		id2 := openRaw(t, locker, api, longTTL).SessionId
		faulty.FailOnce("close_session", fmt.Errorf("injected: %w", store.ErrUnavailable), false)
		if _, err := api.CloseSession(locker, &lockdv1.CloseSessionRequest{SessionId: id2}); status.Code(err) != codes.Unavailable {
			t.Fatalf("CloseSession with the backend failing = %v; want UNAVAILABLE", err)
		}
		testkit.Eventually(t, 10*time.Second, "the retried close as session_closed {by locker, rule lockers}", closedBy(logs, id2, "locker", "lockers"))

		// A close lockd decides itself: by empty, rule shutdown.
		cfg := lockdtest.Config()
		cfg.CloseSessionsOnShutdown = true
		log2, logs2 := testkit.NewLogger()
		srv2 := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg, Logger: log2})
		s, err := srv2.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		if err := srv2.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		testkit.Eventually(t, 5*time.Second, "session_closed {by \"\", rule shutdown}", closedBy(logs2, s.ID(), "", "shutdown"))
	})
}
