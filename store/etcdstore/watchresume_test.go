package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// TestWatchFromRevision: a watch resumed (on another instance) after the
// first of two events of one revision — a hand-over's released and
// acquired — delivers the second and what followed, each once; a cursor
// ahead of the store is a resync (C2 #ct2-watch-resume).
func TestWatchFromRevision(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	a := newStore(t, etcdtest.NewClient(t), prefix, nil)
	b := newStore(t, etcdtest.NewClient(t), prefix, nil)
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	defer cancel1()
	_, ch, err := a.WatchFrom(ctx1, "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	holder := openSession(t, a, 5*time.Second)
	waiter := openSession(t, b, 5*time.Second)
	g1 := mustTry(t, a, holder, "h")
	got := make(chan error, 1)
	var g2 store.Grant
	go func() { // ends when the waiter is granted or the test's ctx ends
		var err error
		g2, err = b.Acquire(ctxT(t), waiter, "h")
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
	evs := recv(t, ch, 3)
	if evs[1].Kind != store.EventReleased || evs[2].Kind != store.EventAcquired {
		t.Fatalf("events %+v; want acquired, released, acquired", evs)
	}
	cancel1()
	g3 := mustTry(t, a, holder, "k")

	ctx2, cancel2 := context.WithCancel(ctxT(t))
	defer cancel2()
	start, ch2, err := b.WatchFrom(ctx2, "", evs[1].Cursor)
	if err != nil {
		t.Fatalf("WatchFrom(cursor of the released event): %v", err)
	}
	if start != evs[1].Cursor {
		t.Errorf("resumed watch starts at %q; want its cursor %q", start, evs[1].Cursor)
	}
	want := []store.Event{
		{Kind: store.EventAcquired, Key: "h", Session: waiter, Token: g2.Token, Cursor: evs[2].Cursor},
		{Kind: store.EventAcquired, Key: "k", Session: holder, Token: g3.Token},
	}
	resumed := recv(t, ch2, 2)
	want[1].Cursor = resumed[1].Cursor
	if resumed[0] != want[0] || resumed[1] != want[1] || resumed[1].Cursor == "" {
		t.Fatalf("resumed events %+v; want %+v (the hand-over's second event, then the one missed)", resumed, want)
	}
	cancel2()

	// A cursor far ahead of the store's revision is not this store's.
	head, err := a.cli.Get(ctxT(t), "x")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	ahead := a.formatCursor(cursor{rev: head.Header.Revision + 1000})
	ctx3, cancel3 := context.WithCancel(ctxT(t))
	defer cancel3()
	_, ch3, err := b.WatchFrom(ctx3, "", ahead)
	if err != nil {
		t.Fatalf("WatchFrom(ahead): %v", err)
	}
	if ev := recv(t, ch3, 1)[0]; ev.Kind != store.EventResync {
		t.Fatalf("WatchFrom(a cursor ahead of the store): first event %+v; want a resync", ev)
	}
}

// TestWatchFromCompacted: a watch resumed after a revision etcd has
// compacted away starts with a resync, then delivers what follows; before
// the compaction the same cursor replays the missed events (the control).
// The compaction is of the test binary's shared etcd: other tests' watches
// are live (synced) and unaffected.
func TestWatchFromCompacted(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	cli := etcdtest.NewClient(t)
	a := newStore(t, cli, prefix, nil)
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	defer cancel1()
	_, ch, err := a.WatchFrom(ctx1, "c/", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	id := openSession(t, a, 5*time.Second)
	g1 := mustTry(t, a, id, "c/1")
	e1 := recv(t, ch, 1)[0]
	if e1.Kind != store.EventAcquired || e1.Token != g1.Token {
		t.Fatalf("first event %+v; want acquired c/1 token %d", e1, g1.Token)
	}
	c1 := e1.Cursor
	cancel1()
	g2 := mustTry(t, a, id, "c/2") // missed

	resume := func(what string) (<-chan store.Event, context.CancelFunc) {
		ctx, cancel := context.WithCancel(ctxT(t))
		_, ch, err := a.WatchFrom(ctx, "c/", c1)
		if err != nil {
			cancel()
			t.Fatalf("WatchFrom(c1) %s: %v", what, err)
		}
		return ch, cancel
	}
	ch2, cancel2 := resume("before the compaction")
	if ev := recv(t, ch2, 1)[0]; ev.Kind != store.EventAcquired || ev.Key != "c/2" || ev.Token != g2.Token {
		t.Fatalf("before the compaction: first resumed event %+v; want the missed acquired c/2", ev)
	}
	cancel2()

	head, err := cli.Get(ctxT(t), prefix)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if _, err := cli.Compact(ctxT(t), head.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("Compact(%d): %v", head.Header.Revision, err)
	}
	ch3, cancel3 := resume("after the compaction")
	defer cancel3()
	if ev := recv(t, ch3, 1)[0]; ev.Kind != store.EventResync || ev.Cursor == "" || ev.Key != "" {
		t.Fatalf("after the compaction: first event %+v; want a resync (the missed events are gone), never a gap", ev)
	}
	g3 := mustTry(t, a, id, "c/3")
	if ev := recv(t, ch3, 1)[0]; ev.Kind != store.EventAcquired || ev.Key != "c/3" || ev.Token != g3.Token {
		t.Fatalf("after the resync: event %+v; want acquired c/3 token %d", ev, g3.Token)
	}
}

// recv receives n events from ch within 10 s, failing on a broken watch.
func recv(t *testing.T, ch <-chan store.Event, n int) []store.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	var out []store.Event
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok || ev.Err != nil {
				t.Fatalf("watch ended after %d of %d events (%+v): %v", len(out), n, out, ev.Err)
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("%d of %d events within 10 s: %+v", len(out), n, out)
		}
	}
	return out
}
