package lockdtest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"lock.dev/lockd/internal/pgtest"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/pgstore"
)

// StoreOptions configure NewStore.
type StoreOptions struct {
	Logger  *slog.Logger
	Metrics *telemetry.Metrics
}

// Namespace is an isolated namespace on a backend (an etcd key prefix, a
// PostgreSQL database) on which OpenStore opens independent store
// instances, standing in for lockd replicas sharing the backend.
type Namespace struct {
	backend string
	etcdNS  string // etcd key prefix
	pgDSN   string // database DSN
}

// NewNamespace prepares a fresh namespace on backend.
func NewNamespace(t testing.TB, backend string) *Namespace {
	t.Helper()
	switch backend {
	case server.BackendPG:
		return &Namespace{backend: backend, pgDSN: pgtest.NewDatabase(t)}
	case server.BackendEtcd:
		return &Namespace{backend: backend, etcdNS: etcdPrefix(t)}
	}
	t.Fatalf("lockdtest: unknown backend %q", backend)
	return nil
}

// OpenStore opens a new store instance on the namespace, closed when the
// test ends.
func (ns *Namespace) OpenStore(t testing.TB, opts StoreOptions) store.LockStore {
	t.Helper()
	var (
		st  store.LockStore
		err error
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch ns.backend {
	case server.BackendPG:
		st, err = pgstore.New(ctx, pgstore.Options{DSN: ns.pgDSN, ReaperInterval: 200 * time.Millisecond,
			Logger: opts.Logger, Metrics: opts.Metrics})
	case server.BackendEtcd:
		st, err = openEtcdStore(ctx, t, ns.etcdNS, opts)
	}
	if err != nil {
		t.Fatalf("lockdtest: open %s store: %v", ns.backend, err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("lockdtest: close %s store: %v", ns.backend, err)
		}
	})
	return st
}

// NewStore opens a store on a fresh namespace of backend.
func NewStore(t testing.TB, backend string, opts StoreOptions) store.LockStore {
	t.Helper()
	return NewNamespace(t, backend).OpenStore(t, opts)
}
