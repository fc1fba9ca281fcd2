package etcdstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/storetest"
)

// TestMain runs four parallel tests at once instead of GOMAXPROCS (two): the
// conformance subtests mostly wait for TTLs, lock delays and expiries (the
// package used about 0.28 of a core in a clean-clone run: 115 s of wall for
// 33 s of CPU; issue 21, CI time).
func TestMain(m *testing.M) {
	testkit.DefaultParallel(4)
	etcdtest.Main(m)
}

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

// metricStore returns a Store recording metrics, and its registry.
func metricStore(t *testing.T) (*Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	met, err := telemetry.NewMetrics(reg, Backend)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	st, err := New(ctxT(t), etcdtest.NewClient(t), Options{Prefix: etcdtest.Prefix(t), Metrics: met})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st, reg
}

// batchMetric reads lockd_backend_batch_size{batch="locks"}: how many
// batches were observed and how many requests they held.
func batchMetric(t *testing.T, reg *prometheus.Registry) (batches, requests uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockd_backend_batch_size" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "batch" && l.GetValue() == telemetry.BatchLocks {
					return m.GetHistogram().GetSampleCount(), uint64(m.GetHistogram().GetSampleSum())
				}
			}
		}
	}
	return 0, 0
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
		HoldCommit: holdCommit,
	})
}

// holdCommit is storetest's Config.HoldCommit: through the lock batches'
// commit hook and the group commit's settling hook.
func holdCommit(t *testing.T, s store.LockStore, key string) (held <-chan struct{}, open func(), settling <-chan struct{}) {
	st := s.(*Store)
	setHook := func(f func(keys []string)) {
		if f == nil {
			st.commitHook.Store(nil)
			return
		}
		st.commitHook.Store(&f)
	}
	return storetest.HoldCommitWith(t, key, setHook, st.batch.SetSettling)
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
