package lockdtest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

// StoreOptions configure Namespace.OpenStore.
type StoreOptions struct {
	Logger  *slog.Logger
	Metrics *telemetry.Metrics
}

// pgReaperInterval is the lock.pg.reaper-interval of test stores: expired
// sessions go within a fraction of TTL.
const pgReaperInterval = 200 * time.Millisecond

// storeOpenTimeout bounds opening a test store (OpenStore).
const storeOpenTimeout = 30 * time.Second

// Namespace is an isolated namespace on a backend (an etcd key prefix, a
// PostgreSQL database) on which OpenStore opens independent store
// instances, standing in for lockd replicas sharing the backend.
type Namespace struct {
	backend string
	etcdNS  string // etcd key prefix
	pgDSN   string // database DSN
}

// NewNamespace prepares a fresh namespace on backend (backend.Etcd or
// backend.PG).
func NewNamespace(t testing.TB, kind string) *Namespace {
	t.Helper()
	switch kind {
	case backend.PG:
		return &Namespace{backend: kind, pgDSN: pgtest.NewDatabase(t)}
	case backend.Etcd:
		return &Namespace{backend: kind, etcdNS: etcdtest.Prefix(t)}
	}
	t.Fatalf("lockdtest: unknown backend %q", kind)
	return nil
}

// OpenStore opens a new store instance on the namespace, closed when the
// test ends. It is a *backend.Backend: closing it closes its etcd client or
// pool too.
func (ns *Namespace) OpenStore(t testing.TB, opts StoreOptions) store.LockStore {
	t.Helper()
	var eps []string
	if ns.backend == backend.Etcd {
		eps = etcdtest.Endpoints(t)
	}
	b, err := ns.open(eps, opts)
	if err != nil {
		t.Fatalf("lockdtest: open %s store: %v", ns.backend, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("lockdtest: close %s store: %v", ns.backend, err)
		}
	})
	return b
}

// open opens a store on the namespace through etcd endpoints eps (etcd
// only), within storeOpenTimeout.
func (ns *Namespace) open(eps []string, opts StoreOptions) (*backend.Backend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
	defer cancel()
	return backend.Open(ctx, ns.config(eps), opts.Logger, opts.Metrics)
}

// config is the backend configuration of a store on the namespace; eps are
// the shared etcd's endpoints (etcd only).
func (ns *Namespace) config(eps []string) backend.Config {
	cfg := backend.DefaultConfig()
	cfg.Kind = ns.backend
	switch ns.backend {
	case backend.Etcd:
		cfg.EtcdEndpoints, cfg.EtcdPrefix = eps, ns.etcdNS
		// Opening the store is set-up, not the behaviour under test: bound
		// it like OpenStore's ctx. lock.etcd.dial-timeout's 5 s default
		// also bounds the epoch write, which the shared etcd of a loaded
		// 2-core test run once took longer than that to apply (clean-clone
		// CI, server.TestSessionPrincipalBinding/etcd).
		cfg.EtcdDialTimeout = storeOpenTimeout
	case backend.PG:
		cfg.PGDSN, cfg.PGReaperInterval = ns.pgDSN, pgReaperInterval
	}
	return cfg
}
