package pgstore

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/storetest"
)

// testReaperInterval is the reaper interval of the stores under test.
const testReaperInterval = 250 * time.Millisecond

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(runChild())
	}
	testkit.Main(pgtest.M{M: m}, nil)
}

// newStore opens a Store on dsn, closed when the test ends.
func newStore(t testing.TB, dsn string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := New(ctx, Options{DSN: dsn, ReaperInterval: testReaperInterval})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// expire moves the session's expires_at into the past, as if nobody had
// heartbeated it for its TTL; the reaper then takes it.
func expire(t testing.TB, s *Store, id store.SessionID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tag, err := s.pool.Exec(ctx, "UPDATE "+s.schemaIdent()+".sessions SET expires_at = now() - interval '1 second' WHERE id = $1", string(id))
	if err != nil {
		t.Fatalf("expire %s: %v", id, err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("expire %s: %d rows updated, want 1", id, tag.RowsAffected())
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Config{
		Namespace: func(t *testing.T) func(t *testing.T) store.LockStore {
			dsn := pgtest.NewDatabase(t)
			return func(t *testing.T) store.LockStore { return newStore(t, dsn) }
		},
		ExpirySlack: testReaperInterval,
		Expire: func(t *testing.T, s store.LockStore, id store.SessionID) {
			expire(t, s.(*Store), id)
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
	return storetest.HoldCommitWith(t, key, setHook, st.lockQ.SetSettling)
}

const (
	// ttl is the TTL of sessions meant to expire.
	ttl = store.MinTTL
	// longTTL is the TTL of sessions that must outlive their test, which
	// does not heartbeat them, however slowly a loaded machine runs it.
	longTTL = 10 * time.Minute
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openSession(t testing.TB, s *Store) store.SessionID {
	t.Helper()
	sess, err := s.OpenSession(testCtx(t), longTTL)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	return sess.ID
}

func mustTry(t testing.TB, s *Store, id store.SessionID, key string) store.Grant {
	t.Helper()
	g, ok, err := s.TryInsert(testCtx(t), id, key)
	if err != nil || !ok {
		t.Fatalf("TryInsert(%q) = %v, %v; want a grant", key, ok, err)
	}
	return g
}

// count returns the number of rows of a table of s's schema.
func count(t testing.TB, s *Store, table string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(testCtx(t), "SELECT count(*) FROM "+s.schemaIdent()+"."+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func inspectT(t *testing.T, s *Store, key string) (store.LockInfo, bool) {
	t.Helper()
	info, found, err := s.Inspect(testCtx(t), key)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", key, err)
	}
	return info, found
}

func waitersAreT(t *testing.T, s *Store, key string, want []store.SessionID) {
	t.Helper()
	info, found := inspectT(t, s, key)
	if !found || !slices.Equal(info.Waiters, want) {
		t.Fatalf("Inspect(%s) = %+v, %v; want waiters %v", key, info, found, want)
	}
}

// metricValue sums the samples of a metric family whose labels include
// labels.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
