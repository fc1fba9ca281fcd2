package etcdstore

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// answer is what one Acquire call returned.
type answer struct {
	g   store.Grant
	err error
}

// waitFirst starts an Acquire of key by session id on st and returns the
// channel its answer arrives on, once the call waits first in line for the
// grant key (st.waitingHook must send on waiting).
func waitFirst(t *testing.T, ctx context.Context, st *Store, waiting <-chan string, id store.SessionID, key string) <-chan answer {
	t.Helper()
	res := make(chan answer, 1)
	go func() { // exits when Acquire returns (bounded by ctx)
		g, err := st.Acquire(ctx, id, key)
		res <- answer{g, err}
	}()
	select {
	case <-waiting:
	case a := <-res:
		t.Fatalf("Acquire(%q) returned %+v, %v before it waited", key, a.g, a.err)
	case <-time.After(30 * time.Second):
		t.Fatalf("Acquire(%q) did not start waiting first in line within 30 s", key)
	}
	return res
}

// acquiredOnce checks that st logged exactly one lock_acquired for grant g.
func acquiredOnce(t *testing.T, logs *testkit.LogBuffer, g store.Grant) {
	t.Helper()
	n := 0
	for _, rec := range logs.Events("lock_acquired") {
		if rec["session"] == string(g.Session) && rec["key"] == g.Key && rec["token"] == float64(g.Token) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("lock_acquired logged %d times for %s's grant of %q token %d; want once", n, g.Session, g.Key, g.Token)
	}
}

// handOverStore is a Store with logs, hooks for waiting Acquire calls
// (waiting), and a holder and a waiter session.
func handOverStore(t *testing.T) (st *Store, logs *testkit.LogBuffer, waiting chan string, holder, waiter store.SessionID) {
	t.Helper()
	logger, logs := testkit.NewLogger()
	st = newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), logger)
	waiting = make(chan string, 64)
	st.waitingHook = func(key string) {
		select {
		case waiting <- key:
		default:
		}
	}
	return st, logs, waiting, openSession(t, st, 10*time.Second), openSession(t, st, 10*time.Second)
}

// TestLocalWaiterAnsweredFromRelease: a waiter of the releasing Store is
// answered from the release's commit (C2 #ct2-release-handover), with its
// watch events held back. Before issue 24's tell it waited for the watch
// event: on that code this test fails with "not answered within 20 s".
func TestLocalWaiterAnsweredFromRelease(t *testing.T) {
	st, logs, waiting, holder, waiter := handOverStore(t)
	gate := make(chan struct{})
	st.eventGate = gate
	t.Cleanup(func() { close(gate) }) // before the Store's Close (cleanups run last-in first)
	ctx := ctxT(t)
	g0 := mustTry(t, st, holder, "k")
	res := waitFirst(t, ctx, st, waiting, waiter, "k")
	if err := st.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	var a answer
	select {
	case a = <-res:
	case <-time.After(20 * time.Second):
		t.Fatalf("the waiter was not answered within 20 s of the release with its watch events held back: it waits for the notification, not the release's commit")
	}
	if a.err != nil {
		t.Fatalf("Acquire: %v", a.err)
	}
	info, found, err := st.Inspect(ctx, "k")
	if err != nil || !found {
		t.Fatalf("Inspect: %v, found %v", err, found)
	}
	if a.g.Session != waiter || a.g.Key != "k" || a.g.Token != info.Token || info.Session != waiter || a.g.Token <= g0.Token {
		t.Fatalf("answer %+v, Inspect %+v; want the waiter's grant as committed, token above %d", a.g, info, g0.Token)
	}
	if !a.g.AcquiredAt.Equal(info.AcquiredAt) {
		t.Fatalf("answer acquired at %v, Inspect %v; want the time the commit wrote", a.g.AcquiredAt, info.AcquiredAt)
	}
	if a.g.Remaining <= 0 || a.g.Remaining > 10*time.Second {
		t.Fatalf("answer Remaining %v; want in (0, TTL]", a.g.Remaining)
	}
	acquiredOnce(t, logs, a.g)
	if err := st.DeleteIfOwner(ctx, waiter, "k", a.g.Token); err != nil {
		t.Fatalf("the waiter's release of its answered grant: %v", err)
	}
}

// TestLocalHandOverAnsweredOnce: the tell and the watch event both reach
// the waiter, in either order; the call answers once (one grant, one
// lock_acquired), and the session holds the key once.
func TestLocalHandOverAnsweredOnce(t *testing.T) {
	t.Run("tell-then-event", func(t *testing.T) {
		st, logs, waiting, holder, waiter := handOverStore(t)
		gate := make(chan struct{})
		st.eventGate = gate
		ctx := ctxT(t)
		g0 := mustTry(t, st, holder, "k")
		res := waitFirst(t, ctx, st, waiting, waiter, "k")
		if err := st.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
		a := <-res
		close(gate) // the watch event, late
		if a.err != nil || a.g.Session != waiter {
			t.Fatalf("Acquire = %+v, %v; want the waiter's grant", a.g, a.err)
		}
		checkOnce(t, ctx, st, logs, a.g)
	})
	t.Run("event-then-tell", func(t *testing.T) {
		st, logs, waiting, holder, waiter := handOverStore(t)
		ctx := ctxT(t)
		g0 := mustTry(t, st, holder, "k")
		res := waitFirst(t, ctx, st, waiting, waiter, "k")
		answered := make(chan answer, 1)
		hookAt(t, st, hookHandedOver, func(string) { answered <- <-res }) // the tell waits for the watch event's answer
		if err := st.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
		a := <-answered
		if a.err != nil || a.g.Session != waiter {
			t.Fatalf("Acquire = %+v, %v; want the waiter's grant", a.g, a.err)
		}
		checkOnce(t, ctx, st, logs, a.g)
	})
	t.Run("contended", func(t *testing.T) {
		// Both paths race on every hand-over; no hook.
		logger, logs := testkit.NewLogger()
		st := newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), logger)
		var cs []contender
		var (
			mu     sync.Mutex
			grants []store.Grant
		)
		for range 3 {
			id := openSession(t, st, 10*time.Second)
			var token uint64
			cs = append(cs, contender{
				lock: func(ctx context.Context) error {
					g, err := st.Acquire(ctx, id, "hot")
					token = g.Token
					if err == nil {
						mu.Lock()
						grants = append(grants, g)
						mu.Unlock()
					}
					return err
				},
				unlock: func(ctx context.Context) error { return st.DeleteIfOwner(ctx, id, "hot", token) },
			})
		}
		handovers(t, cs, 30, 0)
		slices.SortFunc(grants, func(a, b store.Grant) int { return cmp.Compare(a.Token, b.Token) })
		for i, g := range grants {
			acquiredOnce(t, logs, g)
			if i > 0 && g.Token == grants[i-1].Token {
				t.Fatalf("token %d answered twice", g.Token)
			}
		}
		if n := len(logs.Events("lock_acquired")); n != len(grants) {
			t.Fatalf("%d lock_acquired for %d grants answered", n, len(grants))
		}
	})
}

// checkOnce checks that grant g was logged once, that its session holds the
// key once, and that the grant releases.
func checkOnce(t *testing.T, ctx context.Context, st *Store, logs *testkit.LogBuffer, g store.Grant) {
	t.Helper()
	acquiredOnce(t, logs, g)
	held, err := st.LocksOf(ctx, g.Session)
	if err != nil {
		t.Fatalf("LocksOf: %v", err)
	}
	if len(held) != 1 || held[0].Key != g.Key || held[0].Token != g.Token {
		t.Fatalf("LocksOf(%s) = %+v; want the one grant %q token %d", g.Session, held, g.Key, g.Token)
	}
	if err := st.DeleteIfOwner(ctx, g.Session, g.Key, g.Token); err != nil {
		t.Fatalf("release of the answered grant: %v", err)
	}
}
