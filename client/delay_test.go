package client_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestLockDelayAndMaxHold: issue #15 §5 through the server and the SDK
// (C2 #ct2-delay). A lock past WithMaxHold is revoked by the server and
// its Done closes with ErrMaxHold; its lock-delay (the session's default)
// then keeps the key from another session, which Inspect shows; the
// server refuses values above its maxima.
func TestLockDelayAndMaxHold(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		cfg := lockdtest.Config()
		cfg.MaxLockDelay = 5 * time.Second
		cfg.MaxHoldLimit = time.Minute
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg})
		ctx := testCtx(t, time.Minute)
		const delay, hold = 3 * time.Second, time.Second
		holder := newSession(t, ctx, srv.Client, client.WithSessionLockDelay(delay))
		events, err := srv.Client.Watch(ctx, "delay/")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		start := time.Now()
		l, err := holder.Acquire(ctx, "delay/a", client.WithMaxHold(hold))
		if err != nil {
			t.Fatalf("Acquire(WithMaxHold): %v", err)
		}
		other := srv.NewClient(t)
		if info, err := other.Inspect(ctx, "delay/a"); err != nil || !info.Held || info.LockDelay != delay {
			t.Fatalf("Inspect of the held key = %+v, %v; want held with LockDelay %v (the session's default)", info, err, delay)
		}
		select {
		case <-l.Done():
		case <-time.After(hold + 15*time.Second):
			t.Fatalf("the lock was not lost within its maximum hold %v plus slack", hold)
		}
		lost := time.Now()
		if el := lost.Sub(start); el < hold {
			t.Fatalf("the lock was lost %v after its Acquire was sent; want no earlier than its maximum hold %v", el, hold)
		}
		if err := l.Err(); !errors.Is(err, client.ErrMaxHold) || !errors.Is(err, client.ErrLockLost) {
			t.Fatalf("Lock.Err() after the maximum hold = %v; want ErrMaxHold (and ErrLockLost)", err)
		}
		// Watchers see the end as max_hold.
		seen := false
		for ev := range events {
			if ev.Err != nil {
				t.Fatalf("watch broke: %v", ev.Err)
			}
			if ev.Token == l.Token() && ev.Kind != client.EventAcquired {
				if ev.Kind != client.EventMaxHold || ev.Kind.String() != "max_hold" {
					t.Fatalf("watch event of the held-too-long grant = %v (%d); want max_hold", ev.Kind, ev.Kind)
				}
				seen = true
				break
			}
		}
		if !seen {
			t.Fatal("the watch ended without the grant's end")
		}
		// The lock-delay runs: another session cannot take the key, and
		// Inspect says how long it still waits.
		s2 := newSession(t, ctx, other)
		info, err := other.Inspect(ctx, "delay/a")
		if err != nil || info.Held || info.DelayRemaining <= 0 || info.DelayRemaining > delay+5*time.Second {
			t.Fatalf("Inspect during the lock-delay = %+v, %v; want free with DelayRemaining in (0, %v]", info, err, delay+5*time.Second)
		}
		if _, err := s2.TryAcquire(ctx, "delay/a"); !errors.Is(err, client.ErrLocked) {
			t.Fatalf("TryAcquire during the lock-delay = %v; want ErrLocked", err)
		}
		l2, err := s2.Acquire(ctx, "delay/a")
		if err != nil {
			t.Fatalf("Acquire after the lock-delay: %v", err)
		}
		if el := time.Since(lost); el < delay-time.Second { // lost was seen after the revoke; a second of slack for the notice
			t.Errorf("granted %v after the loss was seen; want about the lock-delay %v", el, delay)
		}
		if l2.Token() <= l.Token() {
			t.Fatalf("token after the lock-delay = %d; want above %d", l2.Token(), l.Token())
		}

		// Above the server's maxima, and out of the SPI's bounds.
		for _, tc := range []struct {
			opt   client.AcquireOption
			field string
		}{
			{client.WithLockDelay(6 * time.Second), "lock_delay_ms"},
			{client.WithMaxHold(2 * time.Minute), "max_hold_ms"},
			{client.WithMaxHold(time.Millisecond), "max_hold"},
		} {
			if _, err := s2.TryAcquire(ctx, "delay/b", tc.opt); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("TryAcquire(%s too large or small) = %v; want ErrInvalidArgument naming %s", tc.field, err, tc.field)
			}
		}
		testkit.Eventually(t, 5*time.Second, "the refused acquires hold nothing", func() bool {
			info, err := other.Inspect(ctx, "delay/b")
			return err == nil && !info.Held
		})
	})
}

// TestLockDelayNotWithMulti: lock-delay and maximum hold are for plain locks
// (C2 #ct2-delay): the SDK refuses them with WithLimit, Shared and
// Exclusive, and a session's WithSessionLockDelay is not sent for those,
// which the server would refuse.
func TestLockDelayNotWithMulti(t *testing.T) {
	srv := lockdtest.StartBackend(t, "etcd", lockdtest.Options{})
	ctx := testCtx(t, time.Minute)
	s := newSession(t, ctx, srv.Client, client.WithSessionLockDelay(time.Second))
	for name, opts := range map[string][]client.AcquireOption{
		"limit and lock-delay":     {client.WithLimit(2), client.WithLockDelay(time.Second)},
		"shared and max hold":      {client.Shared(), client.WithMaxHold(time.Minute)},
		"exclusive and lock-delay": {client.Exclusive(), client.WithLockDelay(time.Second)},
	} {
		if _, err := s.TryAcquire(ctx, "multi/delay", opts...); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("TryAcquire(%s) = %v; want ErrInvalidArgument", name, err)
		}
	}
	l, err := s.TryAcquire(ctx, "multi/delay", client.WithLimit(2))
	if err != nil {
		t.Fatalf("TryAcquire(WithLimit) of a session with a default lock-delay: %v; want granted (the default is not sent)", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
