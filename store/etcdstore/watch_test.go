package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// TestWatchHandOver: a release with a waiter queued is one transaction
// that hands the key over; the watch reports it as released, then
// acquired, and the waiter gets the newer token.
func TestWatchHandOver(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	a := newStore(t, etcdtest.NewClient(t), prefix, nil)
	b := newStore(t, etcdtest.NewClient(t), prefix, nil)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	_, ch, err := b.WatchFrom(ctx, "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	holder := openSession(t, a, 5*time.Second)
	waiter := openSession(t, b, 5*time.Second)
	g1 := mustTry(t, a, holder, "h")
	got := make(chan error, 1)
	var g2 store.Grant
	go func() {
		var err error
		g2, err = b.Acquire(ctx, waiter, "h")
		got <- err
	}()
	testkit.Eventually(t, 5*time.Second, "waiter queued", func() error {
		info, _, err := a.Inspect(ctxT(t), "h")
		if err != nil || len(info.Waiters) != 1 {
			return fmt.Errorf("waiters %v, %v", info.Waiters, err)
		}
		return nil
	})
	if err := a.DeleteIfOwner(ctxT(t), holder, "h", g1.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter's Acquire: %v", err)
	}
	if g2.Token <= g1.Token || g2.Session != waiter {
		t.Fatalf("handed-over grant %+v, want session %s with a token > %d", g2, waiter, g1.Token)
	}
	if info, _, _ := a.Inspect(ctxT(t), "h"); len(info.Waiters) != 0 {
		t.Fatalf("waiters after the hand-over: %v, want none", info.Waiters)
	}
	want := []store.Event{
		{Kind: store.EventAcquired, Key: "h", Session: holder, Token: g1.Token},
		{Kind: store.EventReleased, Key: "h", Session: holder, Token: g1.Token},
		{Kind: store.EventAcquired, Key: "h", Session: waiter, Token: g2.Token},
	}
	for i, w := range want {
		select {
		case ev := <-ch:
			if ev.Cursor == "" {
				t.Fatalf("event %d = %+v carries no cursor", i, ev)
			}
			if ev.Cursor = ""; ev != w {
				t.Fatalf("event %d = %+v, want %+v", i, ev, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d (%v) not delivered", i, w.Kind)
		}
	}
}

// TestWatchSlowConsumer: a consumer that falls more than the buffer behind
// gets one final event with a retryable error, then a closed channel.
func TestWatchSlowConsumer(t *testing.T) {
	st := newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), nil)
	_, ch, err := st.WatchFrom(ctxT(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	id := openSession(t, st, 5*time.Second)
	for i := range watchBuffer/2 + 10 { // two events each
		g := mustTry(t, st, id, "k")
		if err := st.DeleteIfOwner(ctxT(t), id, "k", g.Token); err != nil {
			t.Fatalf("DeleteIfOwner #%d: %v", i, err)
		}
	}
	// etcd delivers the watch behind the writes, later still on a loaded
	// machine: wait until the buffer and the final error are queued
	// (nobody reads meanwhile), so the consumer is behind on purpose.
	testkit.Eventually(t, 30*time.Second, "watchBuffer events and the final error queued", func() bool {
		return len(ch) == watchBuffer+1
	})
	var last store.Event
	n := 0
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				if !errors.Is(last.Err, store.ErrContention) || !store.IsRetryable(last.Err) {
					t.Fatalf("watch closed after %d events, last %+v; want a final event with a retryable ErrContention", n, last)
				}
				if n > watchBuffer+1 {
					t.Fatalf("%d events delivered, more than the buffer", n)
				}
				return
			}
			last = ev
			n++
		case <-deadline:
			t.Fatalf("watch neither broke nor closed: %d events, last %+v", n, last)
		}
	}
}
