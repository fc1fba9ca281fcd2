package client_test

import (
	"context"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestGrantAfterLongWaitIsTrusted: a lock granted after waiting in the
// queue longer than Remaining − margin is trusted from its grant, not born
// expired (C2 #ct2-confirm: a new lock starts with the later of its grant
// reply's bound, counted from the Acquire's send time, and the session's
// deadline). Before, Done closed at once with "not confirmed by the server
// before its deadline" — a false loss of every long wait.
func TestGrantAfterLongWaitIsTrusted(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testkit.Context(t, 60*time.Second)
		holder, err := srv.Client.NewSession(ctx)
		if err != nil {
			t.Fatalf("holder NewSession: %v", err)
		}
		defer holder.Close(context.Background())
		held, err := holder.Acquire(ctx, "long")
		if err != nil {
			t.Fatalf("holder Acquire: %v", err)
		}
		waiter, err := srv.Client.NewSession(ctx)
		if err != nil {
			t.Fatalf("waiter NewSession: %v", err)
		}
		defer waiter.Close(context.Background())
		type result struct {
			err  error
			sent time.Time
		}
		got := make(chan result, 1)
		var l interface {
			Done() <-chan struct{}
			Deadline() time.Time
		}
		sent := time.Now()
		go func() { // ends when the waiter is granted or ctx ends
			lk, err := waiter.Acquire(ctx, "long")
			if err == nil {
				l = lk
			}
			got <- result{err: err, sent: sent}
		}()
		// The holder keeps the key for longer than the TTL, so the waiter's
		// Acquire was sent more than Remaining − margin before its grant.
		testkit.Eventually(t, 30*time.Second, "a wait longer than the TTL", func() bool {
			return time.Since(sent) > lockdtest.TTL
		})
		if err := held.Release(ctx); err != nil {
			t.Fatalf("holder Release: %v", err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter Acquire after %v: %v", time.Since(r.sent), r.err)
		}
		granted := time.Now()
		select {
		case <-l.Done():
			t.Fatalf("the lock granted after a %v wait was lost at once (deadline %v before its grant)",
				granted.Sub(r.sent).Round(time.Millisecond), granted.Sub(l.Deadline()).Round(time.Millisecond))
		default:
		}
		// A heartbeat answer that lists the lock extends it past the grant.
		testkit.Eventually(t, 10*time.Second, "a heartbeat answer to confirm the lock", func() bool {
			return l.Deadline().After(granted.Add(lockdtest.TTL / 2))
		})
		select {
		case <-l.Done():
			t.Fatalf("the lock was lost after a confirming answer")
		default:
		}
	})
}
