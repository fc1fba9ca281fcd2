package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func TestCancelledAcquireLeavesNoWaiterRow(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a, b := newStore(t, dsn), newStore(t, dsn)
	holder := openSession(t, a)
	g := mustTry(t, a, holder, "k")
	w := openSession(t, b)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, w, "k")
		done <- err
	}()
	testkit.Eventually(t, 10*time.Second, "waiter row appears", func() error {
		if n := count(t, a, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after cancel")
	}
	// The row is deleted before Acquire returns.
	if n := count(t, a, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows after the cancelled Acquire returned, want 0", n)
	}
	// The key is still the holder's and free for the next after release.
	if err := a.DeleteIfOwner(testCtx(t), holder, "k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	mustTry(t, a, openSession(t, a), "k")
}

// TestWakeFirstWaiterOnly: a notification that names the key's first waiter
// wakes only that waiter's local Acquire; one that names none wakes them
// all (their queue entries may not be committed yet).
func TestWakeFirstWaiterOnly(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	ids := []store.SessionID{"A", "B", "C"}
	ws := make([]*waiter, len(ids))
	for i, id := range ids {
		w, err := s.addWaiter(id, "k")
		if err != nil {
			t.Fatalf("addWaiter: %v", err)
		}
		defer s.removeWaiter(w)
		ws[i] = w
	}
	other, err := s.addWaiter("A", "other")
	if err != nil {
		t.Fatalf("addWaiter: %v", err)
	}
	defer s.removeWaiter(other)
	woken := func() []store.SessionID {
		var got []store.SessionID
		for i, w := range append(ws, other) {
			select {
			case <-w.wake:
				if i < len(ids) {
					got = append(got, ids[i])
				} else {
					got = append(got, "other")
				}
			default:
			}
		}
		return got
	}
	for _, tc := range []struct {
		payload string
		want    []store.SessionID
	}{
		{`[["released","k","H",7,"B"]]`, []store.SessionID{"B"}},
		{`[["expired","k","H",7,null]]`, ids},
		{`[["revoked","k","H",7]]`, ids},
		{`[["dequeued","k",null,null,"C"]]`, []store.SessionID{"C"}},
		{`[["dequeued","k",null,null,null]]`, ids},
		// A slot's events name the waiters its holders admit (migration 0008).
		{`[["released","k","H",7,"A C"]]`, []store.SessionID{"A", "C"}},
		{`[["dequeued","k",null,null,"-"]]`, nil},
		{`[["acquired","k","H",8,"A"]]`, nil},
		{`[{"kind":"expired","session":"H","keys":["x","k"],"tokens":[1,2]}]`, ids},
	} {
		s.dispatch(tc.payload)
		if got := woken(); !slices.Equal(got, tc.want) {
			t.Errorf("dispatch(%s) woke %v, want %v", tc.payload, got, tc.want)
		}
	}
}
