package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
)

// Schemas and key prefixes the benchmark owns. PostgreSQL schemas are
// dropped and created afresh by every run; etcd prefixes carry a run id and
// are deleted at the end.
const (
	pgLockdSchema = "lockd_bench"
	pgRawSchema   = "lockd_bench_raw"
	pgIdleSchema  = "lockd_bench_idle"

	etcdLockdPrefix = "/lockd-bench/"
	etcdRawPrefix   = "/lockd-bench-raw/"
	etcdMutexPrefix = "/lockd-bench-mutex/"
	etcdIdlePrefix  = "/lockd-bench-idle/"
)

// labelSystem is the pprof label that says which system a CPU sample
// belongs to (Config.CPUProfile); labelBackend is its value for an
// embedded etcd, set by backend.Open. Goroutines inherit the labels of the
// goroutine that starts them, so the label is set while each system's
// clients, servers and stores are created, and while its load runs.
const (
	labelSystem  = backend.ProfileLabel
	labelBackend = backend.ProfileEmbedded
)

// withLabel runs f with the pprof label system=value.
func withLabel(value string, f func()) {
	pprof.Do(context.Background(), pprof.Labels(labelSystem, value), func(context.Context) { f() })
}

// dialTimeout bounds connecting to the backend.
const dialTimeout = 10 * time.Second

// stopTimeout bounds stopping the server and cleaning up.
const stopTimeout = 30 * time.Second

// bed is the test bed of a run: the backend, the lockd server over it with
// a connected SDK client, and the systems to measure on it.
type bed struct {
	backend string // "etcd" or "pg": what the baselines are
	version string // backend server version
	run     string // unique id of this run

	// etcd
	endpoints []string
	etcd      *clientv3.Client // baselines, counting, cleanup
	// pg
	dsn      string
	pool     *pgxpool.Pool // baselines, counting, cleanup
	maxConns int

	srv     *server.Server
	served  chan error
	lockd   *client.Client
	systems []system // lockd first

	closers []func(context.Context) error // run in reverse order by close
}

// newBed starts or connects to the backend of cfg and starts lockd on it.
// On error everything started so far is stopped again.
func newBed(ctx context.Context, cfg Config) (b *bed, err error) {
	b = &bed{run: strings.ToLower(rand.Text()[:8])}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.close())
		}
	}()
	var st store.LockStore
	switch cfg.Backend {
	case BackendEmbedded, BackendEtcd:
		b.backend = BackendEtcd
		st, err = b.startEtcd(ctx, cfg)
	case BackendPG:
		b.backend = BackendPG
		st, err = b.startPG(ctx, cfg)
	default:
		err = fmt.Errorf("unknown backend %q", cfg.Backend)
	}
	if err != nil {
		return b, err
	}
	if err := b.startLockd(st); err != nil {
		return b, err
	}
	return b, nil
}

// onClose registers fn to run at close, before everything registered
// earlier.
func (b *bed) onClose(fn func(context.Context) error) { b.closers = append(b.closers, fn) }

// close stops everything in reverse order of start.
func (b *bed) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var errs []error
	for i := len(b.closers) - 1; i >= 0; i-- {
		errs = append(errs, b.closers[i](ctx))
	}
	b.closers = nil
	return errors.Join(errs...)
}

func (b *bed) startEtcd(ctx context.Context, cfg Config) (store.LockStore, error) {
	// lockd's backend, as `lockd serve` opens it (with an embedded etcd).
	lockdPrefix := etcdLockdPrefix + b.run + "/"
	bcfg := backend.DefaultConfig()
	bcfg.Kind, bcfg.EtcdEndpoints, bcfg.EtcdPrefix, bcfg.EtcdDialTimeout = cfg.Backend, cfg.EtcdEndpoints, lockdPrefix, dialTimeout
	if cfg.Backend == BackendEmbedded {
		bcfg.EmbeddedDataDir = cfg.DataDir
		if bcfg.EmbeddedDataDir == "" {
			tmp, err := os.MkdirTemp("", "lockd-bench-")
			if err != nil {
				return nil, fmt.Errorf("data dir: %w", err)
			}
			bcfg.EmbeddedDataDir = tmp
			b.onClose(func(context.Context) error { return os.RemoveAll(tmp) })
		}
	}
	var (
		lb  *backend.Backend
		err error
	)
	withLabel(sysLockd, func() { lb, err = backend.Open(ctx, bcfg, nil, nil) })
	if err != nil {
		return nil, err
	}
	b.onClose(func(context.Context) error { return lb.Close() })
	b.endpoints = lb.Endpoints()

	// The baselines' client, also used for counting and cleanup.
	raw, err := clientv3.New(etcdstore.ClientConfig(b.endpoints, dialTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", b.endpoints, err)
	}
	b.etcd = raw
	b.onClose(func(context.Context) error { return raw.Close() })
	sctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	status, err := raw.Status(sctx, b.endpoints[0])
	if err != nil {
		return nil, fmt.Errorf("reach etcd %v: %w", b.endpoints, err)
	}
	b.version = "etcd " + status.Version
	b.onClose(func(ctx context.Context) error { // the keys of this run
		var errs []error
		for _, p := range []string{etcdLockdPrefix, etcdRawPrefix, etcdMutexPrefix, etcdIdlePrefix} {
			if _, err := raw.Delete(ctx, p+b.run+"/", clientv3.WithPrefix()); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", p+b.run+"/", err))
			}
		}
		return errors.Join(errs...)
	})
	// The store stops before its keys are deleted; lb.Close closes it again
	// (a no-op), then its client and the embedded etcd.
	b.onClose(func(context.Context) error { return lb.LockStore.Close() })

	b.systems = []system{
		&lockdSystem{count: func(ctx context.Context, prefix string) (int64, error) {
			resp, err := raw.Get(ctx, lockdPrefix+"l/"+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return resp.Count, nil
		}},
		&etcdTxnSystem{cli: raw, prefix: etcdRawPrefix + b.run + "/"},
		&etcdMutexSystem{cli: raw, prefix: etcdMutexPrefix + b.run + "/"},
	}
	return lb, nil
}

func (b *bed) startPG(ctx context.Context, cfg Config) (store.LockStore, error) {
	b.dsn = cfg.PGDSN
	pcfg, err := pgxpool.ParseConfig(cfg.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("parse --pg-dsn: %w", err)
	}
	// The same pool settings as pgstore's own pool from the same DSN.
	b.maxConns = int(pcfg.MaxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgresql: %w", err)
	}
	b.pool = pool
	b.onClose(func(context.Context) error { pool.Close(); return nil })
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var version string
	if err := pool.QueryRow(dctx, "SHOW server_version").Scan(&version); err != nil {
		return nil, fmt.Errorf("reach postgresql: %w", err)
	}
	b.version = "PostgreSQL " + version
	drop := func(ctx context.Context) error {
		for _, s := range []string{pgLockdSchema, pgRawSchema, pgIdleSchema} {
			if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
				return fmt.Errorf("drop schema %s: %w", s, err)
			}
		}
		return nil
	}
	if err := drop(ctx); err != nil {
		return nil, err
	}
	b.onClose(drop)
	raw := &pgRawSystem{pool: pool, q: newPGRawQueries(pgRawSchema)}
	for _, ddl := range raw.q.schema {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return nil, fmt.Errorf("create pg-raw schema: %w", err)
		}
	}
	// lockd's backend, as `lockd serve` opens it.
	bcfg := backend.DefaultConfig()
	bcfg.Kind, bcfg.PGDSN, bcfg.PGSchema = BackendPG, cfg.PGDSN, pgLockdSchema
	var lb *backend.Backend
	withLabel(sysLockd, func() { lb, err = backend.Open(ctx, bcfg, nil, nil) })
	if err != nil {
		return nil, err
	}
	b.onClose(func(context.Context) error { return lb.Close() })
	countQ := `SELECT count(*) FROM ` + pgx.Identifier{pgLockdSchema}.Sanitize() + `.locks WHERE starts_with(key, $1)`
	b.systems = []system{
		&lockdSystem{count: func(ctx context.Context, prefix string) (int64, error) {
			var n int64
			err := pool.QueryRow(ctx, countQ, prefix).Scan(&n)
			return n, err
		}},
		raw,
	}
	return lb, nil
}

// startLockd starts the lockd server over st on 127.0.0.1 and connects the
// SDK client to it.
func (b *bed) startLockd(st store.LockStore) (err error) {
	withLabel(sysLockd, func() { err = b.startLockdLabelled(st) })
	return err
}

func (b *bed) startLockdLabelled(st store.LockStore) error {
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.MetricsListen = "off"
	cfg.SessionTTL = sessionTTL
	srv, err := server.New(cfg, st, server.Options{BackendLabel: b.backend})
	if err != nil {
		return fmt.Errorf("start lockd server: %w", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return errors.Join(fmt.Errorf("listen: %w", err), srv.Shutdown(context.Background()))
	}
	b.srv, b.served = srv, make(chan error, 1)
	go func() { b.served <- srv.Serve(lis) }() // exits after Shutdown (in close)
	b.onClose(func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		if serr := <-b.served; serr != nil {
			err = errors.Join(err, fmt.Errorf("serve: %w", serr))
		}
		return err
	})
	c, err := client.New(lis.Addr().String())
	if err != nil {
		return fmt.Errorf("lockd client: %w", err)
	}
	b.lockd = c
	b.onClose(func(context.Context) error { return c.Close() })
	b.systems[0].(*lockdSystem).c = c
	return nil
}
