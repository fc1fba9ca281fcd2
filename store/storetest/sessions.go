package storetest

// Session lifecycle: open, heartbeat, close and expiry, and what a session's
// death does to its locks.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func (s *suite) testLifecycle(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	if l := heartbeat(t, st, id); !l.Live || l.Remaining <= 0 || l.Remaining > LongTTL+time.Second {
		t.Fatalf("Heartbeat after open = %+v; want live with 0 < Remaining <= ~TTL", l)
	}
	g := mustTry(t, st, id, "life/a")
	if g.Remaining <= 0 {
		t.Fatalf("grant Remaining = %v, want > 0", g.Remaining)
	}
	mustTry(t, st, id, "life/b")
	locks, err := st.LocksOf(ctxT(t), id)
	if err != nil || len(locks) != 2 || locks[0].Key != "life/a" || locks[1].Key != "life/b" {
		t.Fatalf("LocksOf = %+v, %v; want life/a, life/b", locks, err)
	}
	mustRelease(t, st, g)
	n, err := st.CloseSession(ctxT(t), id)
	if err != nil || n != 1 {
		t.Fatalf("CloseSession = %d, %v; want 1, nil", n, err)
	}
	if _, found := inspect(t, st, "life/b"); found {
		t.Fatal("life/b still held after CloseSession")
	}
}

func (s *suite) testCloseIdempotent(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	for _, k := range []string{"c/1", "c/2", "c/3"} {
		mustTry(t, st, id, k)
	}
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 3 {
		t.Fatalf("first CloseSession = %d, %v; want 3, nil", n, err)
	}
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 0 {
		t.Fatalf("second CloseSession = %d, %v; want 0, nil", n, err)
	}
	if n, err := st.CloseSession(ctxT(t), store.NewSessionID()); err != nil || n != 0 {
		t.Fatalf("CloseSession(unknown) = %d, %v; want 0, nil", n, err)
	}
}

func (s *suite) testHeartbeatTerminalAfterClose(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	if _, err := st.CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	for i := range 3 {
		if l := heartbeat(t, st, id); l.Live || l.Remaining != 0 {
			t.Fatalf("Heartbeat #%d after close = %+v; want not live, Remaining 0", i+1, l)
		}
	}
	if l := heartbeat(t, st, store.NewSessionID()); l.Live {
		t.Fatalf("Heartbeat(unknown) = %+v; want not live", l)
	}
}

func (s *suite) testHeartbeatTerminalAfterExpiry(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	mustTry(t, st, id, "hb/x")
	s.cfg.Expire(t, st, id)
	testkit.Eventually(t, s.expiryBound(), "heartbeat reports not live after expiry", func() error {
		l, err := st.Heartbeat(ctxT(t), id)
		if err != nil {
			return err
		}
		if l.Live {
			return fmt.Errorf("still live: %+v", l)
		}
		return nil
	})
	for i := range 3 {
		if l := heartbeat(t, st, id); l.Live {
			t.Fatalf("Heartbeat #%d after expiry = %+v; not-live must be terminal", i+1, l)
		}
	}
	if _, _, err := st.TryInsert(ctxT(t), id, "hb/y"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert on expired session: err = %v, want ErrSessionDead", err)
	}
	testkit.Eventually(t, s.expiryBound(), "expired session's lock is gone", func() error {
		if _, found := inspect(t, st, "hb/x"); found {
			return errors.New("hb/x still held")
		}
		return nil
	})
}

func (s *suite) testSessionDeathReleasesLocks(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	opened := time.Now()
	id := openSessionTTL(t, a, TTL)
	keys := []string{"death/1", "death/2", "death/3"}
	for _, k := range keys {
		mustTry(t, a, id, k)
	}
	waiter := openSession(t, b)
	ctx, cancel := context.WithTimeout(ctxT(t), s.expiryBound()+5*time.Second)
	defer cancel()
	ch := startAcquire(t, ctx, b, waiter, "death/1")
	waitersAre(t, b, "death/1", []store.SessionID{waiter})
	// The instance that keeps the session alive stops, as when lockd dies:
	// nobody heartbeats or keeps the session alive any more.
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	testkit.Eventually(t, s.expiryBound(), "locks of a session whose instance stopped are freed", func() error {
		for _, k := range keys[1:] {
			if _, found := inspect(t, b, k); found {
				return fmt.Errorf("%s still held", k)
			}
		}
		return nil
	})
	r := recvResult(t, ch, s.expiryBound(), "waiter after holder death")
	if r.err != nil || r.g.Session != waiter {
		t.Fatalf("waiter's Acquire = %+v, %v; want the grant", r.g, r.err)
	}
	if took := time.Since(opened); took < TTL-50*time.Millisecond {
		t.Fatalf("locks freed %v after the session was opened; a session must live at least its TTL (%v)", took, TTL)
	}
}

func (s *suite) testExpiredSessionReleasesLocks(t *testing.T) {
	insts := s.instances(t, 2)
	id := openSession(t, insts[0])
	for _, k := range []string{"exp/1", "exp/2"} {
		mustTry(t, insts[0], id, k)
	}
	s.cfg.Expire(t, insts[0], id)
	testkit.Eventually(t, s.expiryBound(), "expired session's locks are freed", func() error {
		l, err := insts[1].List(ctxT(t), "exp/", "", 0)
		if err != nil {
			return err
		}
		if len(l) != 0 {
			return fmt.Errorf("still held: %+v", l)
		}
		return nil
	})
}
