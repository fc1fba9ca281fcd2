package etcdstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/etcdtest"
	"lock.dev/lockd/internal/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/storetest"
)

func TestMain(m *testing.M) { etcdtest.Main(m) }

// newStore opens a Store on cli under prefix, closed when the test ends.
func newStore(t testing.TB, cli *clientv3.Client, prefix string, logger *slog.Logger) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := New(ctx, cli, Options{Prefix: prefix, Logger: logger})
	if err != nil {
		t.Fatalf("New(prefix %q): %v", prefix, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// leaseOf reaches into the Store for a session's lease (tests only).
func leaseOf(t testing.TB, st *Store, id store.SessionID) clientv3.LeaseID {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	ss := st.sessions[id]
	if ss == nil {
		t.Fatalf("session %s unknown to the store", id)
	}
	return ss.lease
}

// revokeLease revokes a session's lease through the etcd API, out of band.
func revokeLease(t testing.TB, cli *clientv3.Client, st *Store, id store.SessionID) {
	t.Helper()
	if _, err := cli.Revoke(ctxT(t), leaseOf(t, st, id)); err != nil {
		t.Fatalf("etcd Revoke of session %s's lease: %v", id, err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// lockKeys reads every grant key under the store's prefix with one range
// read and returns the lockd keys.
func lockKeys(t testing.TB, cli *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := cli.Get(ctxT(t), prefix+"l/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("range read of %sl/: %v", prefix, err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		if k := strings.TrimPrefix(string(kv.Key), prefix+"l/"); !strings.Contains(k, "\x00") {
			keys = append(keys, k)
		}
	}
	return keys
}

func openSession(t testing.TB, st *Store, ttl time.Duration) store.SessionID {
	t.Helper()
	sess, err := st.OpenSession(ctxT(t), ttl)
	if err != nil {
		t.Fatalf("OpenSession(%v): %v", ttl, err)
	}
	return sess.ID
}

func mustTry(t testing.TB, st *Store, id store.SessionID, key string) store.Grant {
	t.Helper()
	g, ok, err := st.TryInsert(ctxT(t), id, key)
	if err != nil || !ok {
		t.Fatalf("TryInsert(%q) = %v, %v; want a grant", key, ok, err)
	}
	return g
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Config{
		Namespace: func(t *testing.T) func(t *testing.T) store.LockStore {
			prefix := etcdtest.Prefix(t)
			return func(t *testing.T) store.LockStore {
				// One client per instance: two lockd replicas.
				return newStore(t, etcdtest.NewClient(t), prefix, nil)
			}
		},
		// etcd checks lease expiry every 500ms.
		ExpirySlack: time.Second,
		Expire: func(t *testing.T, s store.LockStore, id store.SessionID) {
			st := s.(*Store)
			revokeLease(t, st.cli, st, id)
		},
	})
}

// TestEtcdSessionLease is the seed's (T-031) acceptance criteria 1–6; 7 is
// the foundation's AST test.
func TestEtcdSessionLease(t *testing.T) {
	const ttl = 2 * time.Second
	cli := etcdtest.NewClient(t)
	keys := []string{"a", "b", "c"}

	t.Run("1_RevokeLeaseRemovesAllLocks", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		st := newStore(t, cli, prefix, nil)
		id := openSession(t, st, ttl)
		for _, k := range keys {
			mustTry(t, st, id, k)
		}
		if got := lockKeys(t, cli, prefix); len(got) != 3 {
			t.Fatalf("before revoke: grant keys %v, want 3", got)
		}
		revokeLease(t, cli, st, id)
		if got := lockKeys(t, cli, prefix); len(got) != 0 {
			t.Fatalf("one range read after revoking the lease: grant keys %v, want none", got)
		}
	})

	t.Run("2_OneLeasePerSession", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		st := newStore(t, cli, prefix, nil)
		before, err := cli.Leases(ctxT(t))
		if err != nil {
			t.Fatalf("Leases: %v", err)
		}
		id := openSession(t, st, ttl)
		for _, k := range keys {
			mustTry(t, st, id, k)
		}
		after, err := cli.Leases(ctxT(t))
		if err != nil {
			t.Fatalf("Leases: %v", err)
		}
		old := map[clientv3.LeaseID]bool{}
		for _, l := range before.Leases {
			old[l.ID] = true
		}
		var added []clientv3.LeaseID
		for _, l := range after.Leases {
			if !old[l.ID] {
				added = append(added, l.ID)
			}
		}
		lease := leaseOf(t, st, id)
		if len(added) != 1 || added[0] != lease {
			t.Fatalf("leases created by one session with three locks: %v, want exactly its lease %x", added, lease)
		}
		ttlResp, err := cli.TimeToLive(ctxT(t), lease, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatalf("TimeToLive: %v", err)
		}
		if len(ttlResp.Keys) != 3 {
			t.Fatalf("keys attached to the session's lease: %q, want 3", ttlResp.Keys)
		}
	})

	t.Run("3_HeartbeatLiveThenNotLiveAfterRevoke", func(t *testing.T) {
		st := newStore(t, cli, etcdtest.Prefix(t), nil)
		id := openSession(t, st, ttl)
		l, err := st.Heartbeat(ctxT(t), id)
		if err != nil || !l.Live {
			t.Fatalf("Heartbeat while the stream is up = %+v, %v; want live", l, err)
		}
		revokeLease(t, cli, st, id)
		testkit.Eventually(t, ttl+time.Second, "heartbeat not live after an out-of-band revoke", func() error {
			l, err := st.Heartbeat(ctxT(t), id)
			if err != nil {
				return err
			}
			if l.Live {
				return errors.New("still live")
			}
			return nil
		})
		for i := range 3 {
			if l, err := st.Heartbeat(ctxT(t), id); err != nil || l.Live || l.Remaining != 0 {
				t.Fatalf("Heartbeat #%d after not-live = %+v, %v; want not live again (terminal)", i+2, l, err)
			}
		}
	})

	t.Run("4_StoppedKeepaliveExpiresWithinTTL", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		st := newStore(t, cli, prefix, nil)
		id := openSession(t, st, ttl)
		mustTry(t, st, id, "a")
		lease := leaseOf(t, st, id)
		// Closing the store stops its keepalive stream (as when lockd dies).
		st.Close()
		stopped := time.Now()
		resp, err := cli.TimeToLive(ctxT(t), lease)
		if err != nil || resp.TTL <= 0 {
			t.Fatalf("TimeToLive right after the keepalive stopped = %+v, %v; want the lease still alive", resp, err)
		}
		testkit.Eventually(t, ttl+2*time.Second, "lease expires after its keepalive stopped", func() error {
			resp, err := cli.TimeToLive(ctxT(t), lease)
			if err != nil {
				return err
			}
			if resp.TTL != -1 {
				return errors.New("lease still alive")
			}
			return nil
		})
		if got := lockKeys(t, cli, prefix); len(got) != 0 {
			t.Fatalf("grant keys after the lease expired: %v, want none", got)
		}
		t.Logf("lease gone %v after the keepalive stopped (TTL %v)", time.Since(stopped).Round(time.Millisecond), ttl)
	})

	t.Run("5_UnknownOrDeadSessionWritesNothing", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		st := newStore(t, cli, prefix, nil)
		if _, _, err := st.TryInsert(ctxT(t), store.NewSessionID(), "unknown"); !errors.Is(err, store.ErrSessionDead) {
			t.Fatalf("TryInsert(unknown session): err = %v, want ErrSessionDead", err)
		}
		// Dead before the store noticed: etcd refuses the put on the
		// missing lease.
		id := openSession(t, st, ttl)
		revokeLease(t, cli, st, id)
		if _, _, err := st.TryInsert(ctxT(t), id, "dead"); !errors.Is(err, store.ErrSessionDead) {
			t.Fatalf("TryInsert(session whose lease was just revoked): err = %v, want ErrSessionDead", err)
		}
		// Known dead.
		if l, err := st.Heartbeat(ctxT(t), id); err != nil || l.Live {
			t.Fatalf("Heartbeat after the refused grant = %+v, %v; want not live", l, err)
		}
		if _, _, err := st.TryInsert(ctxT(t), id, "dead2"); !errors.Is(err, store.ErrSessionDead) {
			t.Fatalf("TryInsert(dead session): err = %v, want ErrSessionDead", err)
		}
		if got := lockKeys(t, cli, prefix); len(got) != 0 {
			t.Fatalf("grant keys written by unknown/dead sessions: %v, want none", got)
		}
	})

	t.Run("6_CloseTwice", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		st := newStore(t, cli, prefix, nil)
		id := openSession(t, st, ttl)
		for _, k := range keys {
			mustTry(t, st, id, k)
		}
		if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 3 {
			t.Fatalf("first CloseSession = %d, %v; want 3, nil", n, err)
		}
		if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 0 {
			t.Fatalf("second CloseSession = %d, %v; want 0, nil", n, err)
		}
		if got := lockKeys(t, cli, prefix); len(got) != 0 {
			t.Fatalf("grant keys after CloseSession: %v, want none", got)
		}
	})
}

// sample is one heartbeat: when it was called and returned, and its reply.
type sample struct {
	start, end time.Time
	l          store.Liveness
	err        error
}

func beat(st *Store, id store.SessionID) sample {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := sample{start: time.Now()}
	s.l, s.err = st.Heartbeat(ctx, id)
	s.end = time.Now()
	return s
}

// TestOutageShorterThanTTL cuts, then pauses, the store's connection to etcd
// for less than the TTL: heartbeat never reports not-live (only retryable
// errors), Remaining never grows without an answer, and the locks survive.
func TestOutageShorterThanTTL(t *testing.T) {
	const ttl = 5 * time.Second
	const outage = 2 * time.Second
	for _, mode := range []string{"cut", "pause"} {
		t.Run(mode, func(t *testing.T) {
			prefix := etcdtest.Prefix(t)
			p := etcdtest.NewProxy(t)
			st := newStore(t, etcdtest.NewClient(t, etcdtest.ProxyEndpoint(p)), prefix, nil)
			direct := etcdtest.NewClient(t)
			id := openSession(t, st, ttl)
			for _, k := range []string{"x", "y"} {
				mustTry(t, st, id, k)
			}

			if mode == "cut" {
				p.Cut()
			} else {
				p.Pause()
			}
			began := time.Now()
			var prev *sample
			for time.Since(began) < outage {
				s := beat(st, id)
				switch {
				case s.err != nil && !store.IsRetryable(s.err):
					t.Fatalf("Heartbeat during a %v outage: %v; want a retryable error or live", time.Since(began), s.err)
				case s.err == nil && !s.l.Live:
					t.Fatalf("Heartbeat during a %v outage (TTL %v) reported not live", time.Since(began), ttl)
				case s.err == nil:
					if s.l.Remaining > ttl {
						t.Fatalf("Remaining %v > TTL %v", s.l.Remaining, ttl)
					}
					// No answer can arrive: the bound may only shrink.
					// prev's bound ends by prev.end+Remaining; this one
					// starts no earlier than s.start+Remaining.
					if prev != nil && s.start.Add(s.l.Remaining).After(prev.end.Add(prev.l.Remaining)) {
						t.Fatalf("Remaining grew without an answer: %v at %v, then %v at %v",
							prev.l.Remaining, prev.start.Sub(began), s.l.Remaining, s.start.Sub(began))
					}
					prev = &s
				}
				time.Sleep(50 * time.Millisecond) // polling interval
			}
			p.Restore()

			testkit.Eventually(t, ttl, "a fresh keepalive answer after the outage", func() error {
				s := beat(st, id)
				switch {
				case s.err != nil:
					return s.err
				case !s.l.Live:
					t.Fatalf("Heartbeat after the outage reported not live")
				case s.l.Remaining < ttl-ttl/3-time.Second:
					return errors.New("bound not refreshed yet")
				}
				return nil
			})
			if got := lockKeys(t, direct, prefix); len(got) != 2 {
				t.Fatalf("grant keys after a short outage: %v, want x and y", got)
			}
		})
	}
}

// TestOutagePermanent cuts the store off etcd for good: within about the
// TTL heartbeat reports not-live (keepalive_failed), and stays so after the
// network returns; the lease is then gone and its keys with it.
func TestOutagePermanent(t *testing.T) {
	const ttl = 3 * time.Second
	prefix := etcdtest.Prefix(t)
	p := etcdtest.NewProxy(t)
	logs := &testkit.LogBuffer{}
	st := newStore(t, etcdtest.NewClient(t, etcdtest.ProxyEndpoint(p)), prefix, slog.New(slog.NewJSONHandler(logs, nil)))
	direct := etcdtest.NewClient(t)
	id := openSession(t, st, ttl)
	mustTry(t, st, id, "k")

	p.Cut()
	cut := time.Now()
	var notLive time.Duration
	testkit.Eventually(t, ttl+3*time.Second, "heartbeat not live during a permanent outage", func() error {
		s := beat(st, id)
		if s.err != nil {
			if !store.IsRetryable(s.err) {
				t.Fatalf("Heartbeat during the outage: %v; want retryable", s.err)
			}
			return s.err
		}
		if s.l.Live {
			return errors.New("still live")
		}
		notLive = time.Since(cut)
		return nil
	})
	t.Logf("not live %v after the cut (TTL %v)", notLive.Round(time.Millisecond), ttl)
	// The last answered keepalive was sent at most TTL/3 (+ its round trip)
	// before the cut, so its bound lasts past cut + 2·TTL/3.
	if notLive < ttl/2 {
		t.Fatalf("not live %v after the cut: before the bound of the last answered keepalive could have run out", notLive)
	}
	if !strings.Contains(logs.String(), `"msg":"session_lost"`) || !strings.Contains(logs.String(), `"reason":"keepalive_failed"`) {
		t.Fatalf("logs lack session_lost with reason keepalive_failed:\n%s", logs.String())
	}

	p.Restore()
	testkit.Eventually(t, ttl+2*time.Second, "the given-up session's key is gone once etcd is back", func() error {
		if got := lockKeys(t, direct, prefix); len(got) != 0 {
			return errors.New("key still there")
		}
		return nil
	})
	if s := beat(st, id); s.err != nil || s.l.Live {
		t.Fatalf("Heartbeat after the network returned = %+v, %v; not-live is terminal", s.l, s.err)
	}
	if _, _, err := st.TryInsert(ctxT(t), id, "k2"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert on the given-up session: %v, want ErrSessionDead", err)
	}
}

// TestRemainingWhileHealthy: Remaining stays in (0, TTL] and is refreshed
// by the keepalive stream without any Heartbeat sending anything.
func TestRemainingWhileHealthy(t *testing.T) {
	const ttl = 2 * time.Second
	st := newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), nil)
	id := openSession(t, st, ttl)
	began := time.Now()
	for time.Since(began) < 2*ttl {
		s := beat(st, id)
		if s.err != nil || !s.l.Live {
			t.Fatalf("Heartbeat at %v = %+v, %v; want live", time.Since(began), s.l, s.err)
		}
		if s.l.Remaining <= 0 || s.l.Remaining > ttl {
			t.Fatalf("Remaining %v at %v, want in (0, %v]", s.l.Remaining, time.Since(began), ttl)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
}

// TestClientConfig: the configuration lockd dials etcd with works end to
// end.
func TestClientConfig(t *testing.T) {
	cli, err := clientv3.New(ClientConfig(etcdtest.Endpoints(t), 5*time.Second))
	if err != nil {
		t.Fatalf("clientv3.New(ClientConfig): %v", err)
	}
	defer cli.Close()
	st, err := New(ctxT(t), cli, Options{})
	if err != nil {
		t.Fatalf("New with the default prefix: %v", err)
	}
	defer st.Close()
	if st.prefix != DefaultPrefix {
		t.Fatalf("prefix = %q, want %q", st.prefix, DefaultPrefix)
	}
	id := openSession(t, st, 2*time.Second)
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 0 {
		t.Fatalf("CloseSession = %d, %v; want 0, nil", n, err)
	}
	if _, err := New(ctxT(t), cli, Options{Prefix: "/no-slash"}); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("New(prefix without trailing /): %v, want ErrInvalidArgument", err)
	}
}
