package pgstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func TestCloseEndsWaitersAndWatches(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a, b := newStore(t, dsn), newStore(t, dsn)
	holder := openSession(t, a)
	mustTry(t, a, holder, "k")
	w := openSession(t, b)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(testCtx(t), w, "k")
		done <- err
	}()
	testkit.Eventually(t, 10*time.Second, "waiter row appears", func() error {
		if n := count(t, a, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	_, ch, err := b.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-done; !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("waiting Acquire after Close: %v, want ErrUnavailable", err)
	}
	if n := count(t, a, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows after Close, want 0", n)
	}
	ev, ok := <-ch
	if !ok || !errors.Is(ev.Err, store.ErrUnavailable) {
		t.Fatalf("watch after Close: %+v, %v; want a final event with ErrUnavailable", ev, ok)
	}
	if _, ok := <-ch; ok {
		t.Fatal("watch channel not closed after its final event")
	}
	if _, err := b.Heartbeat(testCtx(t), w); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Heartbeat after Close: %v, want ErrUnavailable", err)
	}
	// Close does not close sessions: the session rows are shared, and a is
	// still there to keep w alive.
	if l, err := a.Heartbeat(testCtx(t), w); err != nil || !l.Live {
		t.Fatalf("Heartbeat through the other instance = %+v, %v; want live", l, err)
	}
}

func TestSchemasAreIsolated(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	open := func(schema string) *Store {
		s, err := New(testCtx(t), Options{DSN: dsn, Schema: schema, ReaperInterval: testReaperInterval})
		if err != nil {
			t.Fatalf("New(schema %s): %v", schema, err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open("lockd_a"), open("lockd_b")
	_, ch, err := b.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	ida := openSession(t, a)
	mustTry(t, a, ida, "k")
	if _, found, err := b.Inspect(testCtx(t), "k"); err != nil || found {
		t.Fatalf("Inspect in the other schema = %v, %v; want not found", found, err)
	}
	if _, _, err := b.TryInsert(testCtx(t), ida, "k"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert with the other schema's session = %v, want ErrSessionDead", err)
	}
	idb := openSession(t, b)
	g := mustTry(t, b, idb, "k")
	select {
	case ev := <-ch:
		if ev.Session != idb || ev.Token != g.Token {
			t.Fatalf("watch on schema b saw %+v, want only b's grant %+v", ev, g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	if _, err := New(testCtx(t), Options{DSN: dsn, Schema: "Bad-Name"}); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("New(bad schema) = %v, want ErrInvalidArgument", err)
	}
}

func TestExternalPool(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	defer pool.Close()
	s, err := New(testCtx(t), Options{Pool: pool})
	if err != nil {
		t.Fatalf("New(Pool): %v", err)
	}
	id := openSession(t, s)
	mustTry(t, s, id, "k")
	s.Close()
	// The pool is the caller's: still usable after Close.
	if err := pool.Ping(testCtx(t)); err != nil {
		t.Fatalf("pool after Store.Close: %v", err)
	}
}
