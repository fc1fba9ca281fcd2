package pgstore

import (
	"errors"
	"testing"
	"time"

	"lock.dev/lockd/internal/pgtest"
	"lock.dev/lockd/store"
)

func TestExpiredSessionIsDeadBeforeReap(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s, err := New(testCtx(t), Options{DSN: dsn, ReaperInterval: time.Hour}) // the reaper never runs here
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	id := openSession(t, s)
	g := mustTry(t, s, id, "k/held")
	expire(t, s, id)

	if l, err := s.Heartbeat(testCtx(t), id); err != nil || l.Live || l.Remaining != 0 {
		t.Fatalf("Heartbeat of an expired, unreaped session = %+v, %v; want not live", l, err)
	}
	var alive bool
	if err := s.pool.QueryRow(testCtx(t), "SELECT expires_at > now() FROM "+s.schemaIdent()+".sessions WHERE id = $1", string(id)).Scan(&alive); err != nil {
		t.Fatalf("read session row: %v", err)
	}
	if alive {
		t.Fatal("Heartbeat resurrected an expired session")
	}
	if _, _, err := s.TryInsert(testCtx(t), id, "k/new"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert = %v, want ErrSessionDead", err)
	}
	if _, err := s.Acquire(testCtx(t), id, "k/new"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("Acquire = %v, want ErrSessionDead", err)
	}
	if _, err := s.LocksOf(testCtx(t), id); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("LocksOf = %v, want ErrSessionDead", err)
	}
	if err := s.DeleteIfOwner(testCtx(t), id, "k/held", g.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("DeleteIfOwner = %v, want ErrNotOwner", err)
	}
	if n := count(t, s, "locks"); n != 1 {
		t.Fatalf("%d lock rows, want only k/held (nothing written for the dead session)", n)
	}
	if n := count(t, s, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows, want 0", n)
	}
	// Closing it deletes it, as the reaper would, and reports nothing
	// released: the lock was already forfeit.
	if n, err := s.CloseSession(testCtx(t), id); err != nil || n != 0 {
		t.Fatalf("CloseSession = %d, %v; want 0, nil", n, err)
	}
	if n := count(t, s, "locks"); n != 0 {
		t.Fatalf("%d lock rows after close, want 0", n)
	}
}

func TestGrantsDoNotExtendSession(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	read := func() time.Time {
		var at time.Time
		if err := s.pool.QueryRow(testCtx(t), "SELECT expires_at FROM "+s.schemaIdent()+".sessions WHERE id = $1", string(id)).Scan(&at); err != nil {
			t.Fatalf("read expires_at: %v", err)
		}
		return at
	}
	before := read()
	g := mustTry(t, s, id, "k")
	if _, err := s.Acquire(testCtx(t), id, "k2"); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if after := read(); !after.Equal(before) {
		t.Fatalf("expires_at moved from %v to %v on a grant", before, after)
	}
	if g.Remaining <= 0 || g.Remaining > longTTL {
		t.Fatalf("grant Remaining = %v, want in (0, %v]", g.Remaining, longTTL)
	}
	l, err := s.Heartbeat(testCtx(t), id)
	if err != nil || !l.Live || l.Remaining != longTTL {
		t.Fatalf("Heartbeat = %+v, %v; want live with Remaining = TTL", l, err)
	}
	if after := read(); !after.After(before) {
		t.Fatalf("Heartbeat did not move expires_at (%v -> %v)", before, after)
	}
}
