package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// inspectCounter counts a client's Inspect calls per key (a gRPC client
// interceptor: what the SDK sends, not a mock of the server).
type inspectCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *inspectCounter) option() client.Option {
	return client.WithDialOptions(grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if r, ok := req.(*lockdv1.InspectRequest); ok {
				c.mu.Lock()
				if c.n == nil {
					c.n = map[string]int{}
				}
				c.n[r.GetKey()]++
				c.mu.Unlock()
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
}

func (c *inspectCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// updates collects one Acquire's WaitUpdates and flags any that comes after
// the Acquire returned.
type updates struct {
	mu       sync.Mutex
	got      []client.WaitUpdate
	returned atomic.Bool
	late     atomic.Int32
}

func (u *updates) fn(w client.WaitUpdate) {
	if u.returned.Load() {
		u.late.Add(1)
	}
	u.mu.Lock()
	u.got = append(u.got, w)
	u.mu.Unlock()
}

func (u *updates) find(ok func(client.WaitUpdate) bool) (client.WaitUpdate, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, w := range u.got {
		if ok(w) {
			return w, true
		}
	}
	return client.WaitUpdate{}, false
}

func (u *updates) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.got)
}

// waitWithUpdates starts s.Acquire(key) with WithWaitUpdates (every 100 ms,
// the least) in a goroutine; the channel gets its result once Acquire
// returned and u.returned is set.
func waitWithUpdates(ctx context.Context, s *client.Session, key string, u *updates) <-chan error {
	done := make(chan error, 1)
	go func() {
		l, err := s.Acquire(ctx, key, client.WithWaitUpdates(client.MinWaitUpdateEvery, u.fn))
		u.returned.Store(true)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	return done
}

// TestWaitUpdates (C2 #ct2-wait-updates), both backends: a second waiter
// behind a holder gets an update with position 1 of 1 (no estimate before
// holds of the key ended, one after), no update comes after its Acquire
// returned, and an Acquire without the option sends no Inspect while one
// with it, waiting as long beside it, does.
func TestWaitUpdates(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, time.Minute)
		var count inspectCounter
		c := srv.NewClient(t, count.option())
		// Their expiry is not the subject (longTTL).
		long := client.WithSessionTTL(longTTL)
		holder, waiter, plain := newSession(t, ctx, c, long), newSession(t, ctx, c, long), newSession(t, ctx, c, long)

		for round, wantEstimate := range []bool{false, true} {
			l, err := holder.Acquire(ctx, "wu/k")
			if err != nil {
				t.Fatal(err)
			}
			pl, err := holder.Acquire(ctx, "wu/plain")
			if err != nil {
				t.Fatal(err)
			}
			var u updates
			base := count.get("wu/k")
			done := waitWithUpdates(ctx, waiter, "wu/k", &u)
			plainDone := make(chan error, 1)
			go func() {
				l, err := plain.Acquire(ctx, "wu/plain")
				if err == nil {
					err = l.Release(ctx)
				}
				plainDone <- err
			}()
			var first client.WaitUpdate
			testkit.Eventually(t, 30*time.Second, "a wait update with position 1 of 1", func() bool {
				var ok bool
				first, ok = u.find(func(w client.WaitUpdate) bool {
					return w.Err == nil && w.Position == 1 && w.Waiters == 1 && (w.HasEstimate || !wantEstimate)
				})
				return ok
			})
			if first.Key != "wu/k" || !first.Info.Held || first.Info.Token != l.Token() || first.Info.Session != holder.ID() {
				t.Errorf("round %d: update %+v; want key wu/k held by the holder, token %d", round, first, l.Token())
			}
			if !wantEstimate && first.HasEstimate {
				t.Errorf("round %d: update %+v has an estimate before any hold of the key ended", round, first)
			}
			if wantEstimate && first.Estimate < 0 {
				t.Errorf("round %d: estimate %v; want >= 0", round, first.Estimate)
			}
			// The plain Acquire, queued, has waited beside the other for more
			// than WaitUpdateDelay (4 reads of wu/k, 100 ms apart): it sent
			// no Inspect.
			testkit.Eventually(t, 30*time.Second, "the plain waiter queued and 4 reads of wu/k", func() bool {
				info, err := srv.Client.Inspect(ctx, "wu/plain")
				return err == nil && len(info.Waiters) == 1 && count.get("wu/k") >= base+4
			})
			if n := count.get("wu/plain"); n != 0 {
				t.Errorf("round %d: an Acquire without WithWaitUpdates sent %d Inspect calls; want 0", round, n)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := pl.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("round %d: waiter: %v", round, err)
			}
			if err := <-plainDone; err != nil {
				t.Fatalf("round %d: plain waiter: %v", round, err)
			}
			if count.get("wu/k") == base {
				t.Errorf("round %d: the Acquire with WithWaitUpdates sent no Inspect", round)
			}
			if n := u.late.Load(); n != 0 {
				t.Errorf("round %d: %d updates after Acquire returned", round, n)
			}
		}
		if n := count.get("wu/plain"); n != 0 {
			t.Errorf("Acquire without WithWaitUpdates sent %d Inspect calls; want 0", n)
		}

		// Bad input is refused before anything is sent.
		if _, err := waiter.Acquire(ctx, "wu/k", client.WithWaitUpdates(client.MinWaitUpdateEvery-1, func(client.WaitUpdate) {})); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("Acquire with updates every 99.999999ms = %v; want ErrInvalidArgument", err)
		}
		if _, err := waiter.AcquireAll(ctx, []string{"wu/a", "wu/b"}, client.WithWaitUpdates(0, func(client.WaitUpdate) {})); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("AcquireAll with WithWaitUpdates = %v; want ErrInvalidArgument", err)
		}
	})
}

// TestWaitUpdatesDenied (C2 #ct2-wait-updates), both backends: a caller who
// may lock a key but not read it gets one update, ErrPermissionDenied with
// no figures, sends no further Inspect, and its Acquire is granted as
// without the option.
func TestWaitUpdatesDenied(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		az, err := auth.New(auth.Config{
			PolicyFile: writeFile(t, dir, "policy.yaml", `
rules:
  - name: alice
    principals: [alice]
    prefixes: ["wu/"]
    allow: [lock]
  - name: bob
    principals: [bob]
    prefixes: ["wu/"]
    allow: [lock, read]
`),
			TokensFile: writeFile(t, dir, "tokens", auth.HashToken("token-of-alice-0123456789")+" alice\n"+
				auth.HashToken("token-of-bob-0123456789")+" bob\n"),
		}, auth.Options{})
		if err != nil {
			t.Fatalf("auth.New: %v", err)
		}
		t.Cleanup(func() { _ = az.Close() })
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Auth: az, NoClient: true})
		ctx := testCtx(t, time.Minute)
		var count, bobCount inspectCounter
		alice := srv.NewClient(t, client.WithBearerToken("token-of-alice-0123456789"), count.option())
		bob := srv.NewClient(t, client.WithBearerToken("token-of-bob-0123456789"), bobCount.option())
		holder := newSession(t, ctx, bob)
		l, err := holder.Acquire(ctx, "wu/k")
		if err != nil {
			t.Fatal(err)
		}
		cl, err := holder.Acquire(ctx, "wu/control")
		if err != nil {
			t.Fatal(err)
		}
		var u, control updates
		done := waitWithUpdates(ctx, newSession(t, ctx, alice), "wu/k", &u)
		// The control: bob, who may read, waits beside alice with the same
		// option; his reads show the time that passed.
		controlDone := waitWithUpdates(ctx, newSession(t, ctx, bob), "wu/control", &control)
		testkit.Eventually(t, 30*time.Second, "an update refused", func() bool { return u.len() > 0 })
		if w, _ := u.find(func(client.WaitUpdate) bool { return true }); !errors.Is(w.Err, client.ErrPermissionDenied) ||
			w.Position != 0 || w.Waiters != 0 || w.HasEstimate || w.Info.Held {
			t.Errorf("update = %+v; want ErrPermissionDenied and no figures", w)
		}
		// bob sees alice and his own control waiter queued: her Acquire
		// goes on; his waiter reads 4 times more once it is queued, and a
		// read after its queue entry committed says position 1 (counting
		// reads from before that commit, the 4 could all come first on a
		// loaded machine: "got no update with position 1", a client stress
		// iteration on PostgreSQL). The test's own Inspect of wu/control
		// ends before base is read, so the reads counted are the waiter's.
		testkit.Eventually(t, 30*time.Second, "alice and bob's control waiter queued", func() bool {
			k, err := bob.Inspect(ctx, "wu/k")
			c, cerr := bob.Inspect(ctx, "wu/control")
			return err == nil && cerr == nil && len(k.Waiters) == 1 && len(c.Waiters) == 1
		})
		base := bobCount.get("wu/control")
		testkit.Eventually(t, 30*time.Second, "4 more reads of the control", func() bool {
			return bobCount.get("wu/control") >= base+4
		})
		if _, ok := control.find(func(w client.WaitUpdate) bool { return w.Err == nil && w.Position == 1 }); !ok {
			t.Errorf("bob's control waiter got no update with position 1")
		}
		if n, m := u.len(), count.get("wu/k"); n != 1 || m != 1 {
			t.Errorf("alice got %d updates after %d Inspect calls; want 1 and 1 (no read after the refusal)", n, m)
		}
		for _, l := range []*client.Lock{l, cl} {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("alice's Acquire with WithWaitUpdates: %v; want granted", err)
		}
		if err := <-controlDone; err != nil {
			t.Fatalf("bob's control Acquire: %v", err)
		}
	})
}
