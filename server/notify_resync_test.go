package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// resyncGate wraps a store: the server's lock-loss watch (WatchFrom of
// every key from now) goes through a relay that, while dropping, loses the
// store's events (each is announced on dropped) and sends an EventResync
// on resync — an etcd watch whose history was compacted under it.
type resyncGate struct {
	store.LockStore
	dropped chan store.Event
	resync  chan struct{}

	mu       sync.Mutex
	dropping bool
	opened   chan struct{} // closed once the lock-loss watch is established
}

func newResyncGate(st store.LockStore) *resyncGate {
	return &resyncGate{LockStore: st, dropped: make(chan store.Event, 64), resync: make(chan struct{}, 1),
		opened: make(chan struct{})}
}

func (g *resyncGate) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropping = true
}

func (g *resyncGate) WatchFrom(ctx context.Context, prefix, after string) (string, <-chan store.Event, error) {
	start, in, err := g.LockStore.WatchFrom(ctx, prefix, after)
	if err != nil || prefix != "" || after != "" {
		return start, in, err
	}
	out := make(chan store.Event, 256)
	go func() { // exits when ctx ends or the store's watch ends
		defer close(out)
		for {
			var ev store.Event
			select {
			case e, ok := <-in:
				if !ok {
					return
				}
				g.mu.Lock()
				dropping := g.dropping
				g.mu.Unlock()
				if dropping && e.Err == nil {
					select {
					case g.dropped <- e:
					default:
					}
					continue
				}
				ev = e
			case <-g.resync:
				ev = store.Event{Kind: store.EventResync, Cursor: start}
			case <-ctx.Done():
				return
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	g.mu.Lock()
	select {
	case <-g.opened:
	default:
		close(g.opened)
	}
	g.mu.Unlock()
	return start, out, nil
}

// TestLockLossWatchResync (issue 22, C2 #ct2-watch-resume): a grant revoked
// through another replica while the server's lock-loss watch misses the
// event is still told to its holder when the store then says events may
// have been missed (EventResync): the server reconciles the grants it
// tracks against the store, as after a broken watch. Before the fix the
// resync was routed like any event and ignored: the holder got no notice.
func TestLockLossWatchResync(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var gate *resyncGate
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { gate = newResyncGate(st); return gate }})
		const ttl = 30 * time.Second
		ctx := testCtx(t, 2*ttl)
		select {
		case <-gate.opened:
		case <-ctx.Done():
			t.Fatal("the server's lock-loss watch was never established")
		}
		api := dial(t, srv.Addr)
		id := openRaw(t, ctx, api, ttl).SessionId
		g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: id, Key: "k"})
		if err != nil || !g.Granted {
			t.Fatalf("Acquire(k) = %v, %v", g, err)
		}
		// Attach a KeepAlive stream, so notices are pushed to it; no
		// heartbeat follows, so only the lock-loss path can tell.
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: 1}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if r := recvReply(t, stream, 1); !r.Live || len(r.Lost) != 0 {
			t.Fatalf("heartbeat = %v; want live, nothing lost", r)
		}

		// Another replica revokes k; the lock-loss watch loses the event.
		gate.drop()
		if _, found, err := gate.LockStore.Revoke(ctx, "k"); err != nil || !found {
			t.Fatalf("Revoke(k) through the store = %v, %v", found, err)
		}
	missed:
		for {
			select {
			case ev := <-gate.dropped:
				if ev.Key == "k" && ev.Kind == store.EventRevoked {
					break missed
				}
			case <-ctx.Done():
				t.Fatal("the lock-loss watch never saw k revoked")
			}
		}
		gate.resync <- struct{}{}

		// The notice must come well inside the session's TTL: a silence
		// close at its end would tell the holder anyway.
		got := make(chan *lockdv1.KeepAliveResponse, 1)
		go func() { // exits when the stream ends (ctx, or the test's end)
			for {
				r, err := stream.Recv()
				if err != nil {
					close(got)
					return
				}
				if len(r.Lost) > 0 {
					got <- r
					return
				}
			}
		}()
		select {
		case r, ok := <-got:
			if !ok {
				t.Fatal("the KeepAlive stream ended before any lock-lost notice")
			}
			if l := r.Lost[0]; len(r.Lost) != 1 || l.Key != "k" || l.Token != g.Token {
				t.Fatalf("pushed notices %v; want one for k, token %d", r.Lost, g.Token)
			}
		case <-time.After(ttl / 2):
			t.Fatalf("no lock-lost notice for the revoked k %v after the resync", ttl/2)
		}
	})
}
