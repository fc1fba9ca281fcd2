package client_test

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(childEnv); addr != "" {
		os.Exit(runChild(addr)) // the SIGKILL test's client process
	}
	if args := os.Getenv(replicaEnv); args != "" {
		os.Exit(runReplica(strings.Split(args, "\n"))) // a replica of TestWatchMovesFromStalledReplica
	}
	testkit.DefaultParallel(clientTestsAtOnce)
	lockdtest.Main(m)
}

// clientTestsAtOnce is the package's default -parallel: its tests mostly
// wait (heartbeats, TTLs, moves between replicas), about 0.45 of a core for
// the whole package in a clean-clone run (issue 21, CI time: 97 s of wall
// for 43 s of CPU), so four at once instead of GOMAXPROCS (two).
const clientTestsAtOnce = 4

// forBackends runs f as a parallel subtest per backend, and makes the test
// that calls it parallel too, so that it runs beside the package's other
// such tests once the sequential ones have ended.
func forBackends(t *testing.T, f func(t *testing.T, backend string)) {
	t.Helper()
	t.Parallel()
	for _, backend := range lockdtest.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			f(t, backend)
		})
	}
}

// longTTL is the TTL of sessions whose expiry is not the point of a test
// (SDK sessions that are only a vehicle for what the test checks): a
// loaded machine may starve the test process for seconds, and with
// lockdtest.TTL (3 s; on etcd a heartbeat's answer may leave under 2 s of
// trust) such a session expires and fails a test about something else
// (issue 21; server/server_test.go has the same rule). Sessions whose
// expiry, silence or heartbeat timing is the subject keep the short TTL.
const longTTL = time.Minute

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newSession(t *testing.T, ctx context.Context, c *client.Client, opts ...client.SessionOption) *client.Session {
	t.Helper()
	s, err := c.NewSession(ctx, opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	return s
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestAcquireRelease(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, srv.Client)
		if s.ID() == "" || s.TTL() < lockdtest.TTL {
			t.Errorf("session id %q, ttl %v; want an id and ttl >= %v", s.ID(), s.TTL(), lockdtest.TTL)
		}
		l, err := s.Acquire(ctx, "a/1")
		if err != nil {
			t.Fatalf("Acquire(a/1): %v", err)
		}
		if l.Key() != "a/1" || l.Token() == 0 || closed(l.Done()) || l.Context().Err() != nil || l.Err() != nil {
			t.Fatalf("lock %q token %d done=%v err=%v; want a live lock on a/1 with a token", l.Key(), l.Token(), closed(l.Done()), l.Err())
		}
		again, err := s.Acquire(ctx, "a/1")
		if err != nil || again != l {
			t.Errorf("Acquire(a/1) again = %p, %v; want the same lock %p", again, err, l)
		}
		info, err := srv.Client.Inspect(ctx, "a/1")
		if err != nil || !info.Held || info.Session != s.ID() || info.Token != l.Token() || info.AcquiredAt.IsZero() {
			t.Errorf("Inspect(a/1) = %+v, %v; want held by %s with token %d", info, err, s.ID(), l.Token())
		}
		infos, next, err := srv.Client.List(ctx, "a/", client.ListOptions{})
		if err != nil || len(infos) != 1 || infos[0].Key != "a/1" || next != "" {
			t.Errorf("List(a/) = %+v, %q, %v; want [a/1] and no next page", infos, next, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !closed(l.Done()) || !errors.Is(l.Err(), client.ErrReleased) || l.Context().Err() == nil {
			t.Errorf("after Release: done=%v err=%v ctx=%v; want done, ErrReleased, cancelled", closed(l.Done()), l.Err(), l.Context().Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("second Release: %v; want nil", err)
		}
		if info, err := srv.Client.Inspect(ctx, "a/1"); err != nil || info.Held {
			t.Errorf("Inspect(a/1) after release = %+v, %v; want free", info, err)
		}
		// Session.Close releases what the session holds.
		if _, err := s.TryAcquire(ctx, "a/2"); err != nil {
			t.Fatalf("TryAcquire(a/2): %v", err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if !closed(s.Done()) || !errors.Is(s.Err(), client.ErrClosed) {
			t.Errorf("after Close: done=%v err=%v; want done, ErrClosed", closed(s.Done()), s.Err())
		}
		if info, err := srv.Client.Inspect(ctx, "a/2"); err != nil || info.Held {
			t.Errorf("Inspect(a/2) after session close = %+v, %v; want free", info, err)
		}
		if _, err := s.Acquire(ctx, "a/3"); !errors.Is(err, client.ErrClosed) {
			t.Errorf("Acquire on a closed session = %v; want ErrClosed", err)
		}
	})
}

// TestTwoClientsContend: two clients take turns on one key through Do; fn
// never runs in both at once, and fencing tokens strictly increase. Do's
// sessions have longTTL (the clients' default): their expiry is not the
// subject.
func TestTwoClientsContend(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		long := client.WithTTL(longTTL)
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{ClientOptions: []client.Option{long}})
		ctx := testCtx(t, 120*time.Second)
		clients := []*client.Client{srv.Client, srv.NewClient(t, long)}
		const rounds = 10
		var (
			inside atomic.Int32
			mu     sync.Mutex
			tokens []uint64
			wg     sync.WaitGroup
			errs   = make(chan error, len(clients)*rounds)
		)
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					errs <- client.Do(ctx, c, "contended", func(ctx context.Context) error {
						if n := inside.Add(1); n != 1 {
							t.Errorf("%d holders inside the critical section", n)
						}
						defer inside.Add(-1)
						tok, ok := client.TokenFromContext(ctx)
						if !ok {
							t.Errorf("no token in Do's context")
						}
						mu.Lock()
						tokens = append(tokens, tok)
						mu.Unlock()
						return nil
					})
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("Do: %v", err)
			}
		}
		if len(tokens) != len(clients)*rounds {
			t.Fatalf("%d critical sections ran; want %d", len(tokens), len(clients)*rounds)
		}
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Errorf("tokens in grant order %v are not strictly increasing at %d", tokens, i)
				break
			}
		}
	})
}

// TestFIFOThreeClients: three clients queue for a held key in a known order
// and are granted in that order. Every session has longTTL: their expiry
// is not the subject.
func TestFIFOThreeClients(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		holder := newSession(t, ctx, srv.Client, client.WithSessionTTL(longTTL))
		hl, err := holder.Acquire(ctx, "fifo")
		if err != nil {
			t.Fatalf("holder Acquire: %v", err)
		}
		type grant struct {
			who   int
			token uint64
		}
		granted := make(chan grant, 3)
		locks := make([]*client.Lock, 3)
		for i := range 3 {
			c := srv.NewClient(t)
			s := newSession(t, ctx, c, client.WithSessionTTL(longTTL))
			go func() {
				l, err := s.Acquire(ctx, "fifo")
				if err != nil {
					t.Errorf("client %d Acquire: %v", i, err)
					granted <- grant{who: i}
					return
				}
				locks[i] = l
				granted <- grant{who: i, token: l.Token()}
			}()
			// Wait until client i is queued before the next one queues.
			testkit.Eventually(t, 10*time.Second, "client queued", func() bool {
				info, err := srv.Client.Inspect(ctx, "fifo")
				return err == nil && len(info.Waiters) == i+1 && info.Waiters[i] == s.ID()
			})
		}
		if err := hl.Release(ctx); err != nil {
			t.Fatalf("holder Release: %v", err)
		}
		last := hl.Token()
		for want := range 3 {
			g := <-granted
			if g.who != want || g.token <= last {
				t.Fatalf("grant %d went to client %d with token %d; want client %d with token > %d", want, g.who, g.token, want, last)
			}
			last = g.token
			if err := locks[g.who].Release(ctx); err != nil {
				t.Fatalf("client %d Release: %v", g.who, err)
			}
		}
	})
}

// TestRevokeReachesHolder: an admin revoke through another client closes
// the holder's Lock.Done and cancels its context; the session stays live
// and a release then reports ErrNotOwner.
func TestRevokeReachesHolder(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, srv.Client)
		l, err := s.Acquire(ctx, "revoked")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		admin := srv.NewClient(t)
		rv, err := admin.Revoke(ctx, "revoked")
		if err != nil || !rv.Held || rv.Token != l.Token() || rv.Session != s.ID() {
			t.Fatalf("Revoke = %+v, %v; want the holder's grant (token %d)", rv, err, l.Token())
		}
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("Lock.Done not closed 5s after the revoke")
		}
		if !errors.Is(l.Err(), client.ErrLockLost) || !errors.Is(context.Cause(l.Context()), client.ErrLockLost) {
			t.Errorf("after revoke: Err %v, context cause %v; want ErrLockLost", l.Err(), context.Cause(l.Context()))
		}
		if closed(s.Done()) {
			t.Errorf("session ended by a revoke: %v", s.Err())
		}
		if err := l.Release(ctx); !errors.Is(err, client.ErrNotOwner) {
			t.Errorf("Release after revoke = %v; want ErrNotOwner", err)
		}
		if rv, err := admin.Revoke(ctx, "revoked"); err != nil || rv.Held {
			t.Errorf("Revoke of a free key = %+v, %v; want nothing revoked", rv, err)
		}
	})
}

// TestReleaseRetryAfterLostReply: the first release deleted the grant but
// its reply was lost (Unavailable); the retry finds the grant gone and
// Release returns nil.
func TestReleaseRetryAfterLostReply(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, srv.Client)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		faulty.FailOnce("release", store.ErrUnavailable, true)
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release with a lost first reply = %v; want nil", err)
		}
		if info, err := srv.Client.Inspect(ctx, "k"); err != nil || info.Held {
			t.Errorf("Inspect(k) = %+v, %v; want free", info, err)
		}
	})
}

// TestWatch: events for a prefix arrive in commit order with their kinds.
func TestWatch(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events, err := srv.Client.Watch(wctx, "w/")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		s := newSession(t, ctx, srv.Client)
		l1, err := s.Acquire(ctx, "w/1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, "other"); err != nil {
			t.Fatal(err)
		}
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2, err := s.Acquire(ctx, "w/2")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Client.Revoke(ctx, "w/2"); err != nil {
			t.Fatal(err)
		}
		l3, err := s.Acquire(ctx, "w/3")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		want := []client.Event{
			{Kind: client.EventAcquired, Key: "w/1", Session: s.ID(), Token: l1.Token()},
			{Kind: client.EventReleased, Key: "w/1", Session: s.ID(), Token: l1.Token()},
			{Kind: client.EventAcquired, Key: "w/2", Session: s.ID(), Token: l2.Token()},
			{Kind: client.EventRevoked, Key: "w/2", Session: s.ID(), Token: l2.Token()},
			{Kind: client.EventAcquired, Key: "w/3", Session: s.ID(), Token: l3.Token()},
			{Kind: client.EventExpired, Key: "w/3", Session: s.ID(), Token: l3.Token()},
		}
		for i, w := range want {
			select {
			case ev, ok := <-events:
				if !ok || !reflect.DeepEqual(ev, w) {
					t.Fatalf("event %d = %+v (open %v); want %+v", i, ev, ok, w)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("event %d (%+v) not delivered", i, w)
			}
		}
		cancel()
		for ev := range events { // closes after the cancel
			if ev.Err != nil {
				t.Errorf("event after cancel carries an error: %v", ev.Err)
			}
		}
	})
}

// TestClientClose: closing the client ends its sessions and frees their
// locks on the server.
func TestClientClose(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		c := srv.NewClient(t)
		var locks []*client.Lock
		for _, key := range []string{"x", "y"} {
			s := newSession(t, ctx, c)
			l, err := s.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, l)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		for _, l := range locks {
			if !closed(l.Done()) || !errors.Is(l.Err(), client.ErrClosed) {
				t.Errorf("lock %s after client Close: done=%v err=%v; want done, ErrClosed", l.Key(), closed(l.Done()), l.Err())
			}
		}
		infos, _, err := srv.Client.List(ctx, "", client.ListOptions{})
		if err != nil || len(infos) != 0 {
			t.Errorf("List after client Close = %+v, %v; want nothing held", infos, err)
		}
	})
}
