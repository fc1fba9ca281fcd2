package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"slices"
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
	pgMinSchema   = "lockd_bench_min"
	// pgFailoverSchema is the failover scenario's replicas' schema.
	pgFailoverSchema = "lockd_bench_failover"

	etcdLockdPrefix = "/lockd-bench/"
	etcdRawPrefix   = "/lockd-bench-raw/"
	etcdMutexPrefix = "/lockd-bench-mutex/"
	etcdElectPrefix = "/lockd-bench-election/"
	etcdSemPrefix   = "/lockd-bench-sem/"
	etcdIdlePrefix  = "/lockd-bench-idle/"
	etcdCeilPrefix  = "/lockd-bench-ceiling/"
	// etcdFailoverPrefix is the failover scenario's replicas' prefix.
	etcdFailoverPrefix = "/lockd-bench-failover/"
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
	// lockdConns is the size of lockd's own pgstore pool (lock.pg.max-conns
	// as `lockd serve` defaults it).
	lockdConns int

	// etcdProc is the etcd process the bench started (--backend etcd
	// without endpoints), else nil.
	etcdProc *child
	// process says where the backend runs; durability how it commits.
	process    string
	durability string
	// dataDir is the backend's data directory, where the fsync ceiling
	// writes; dataDirNote says why it is another directory, if it is.
	dataDir     string
	dataDirNote string

	// own says whether the systems run in processes of their own (see
	// ownProcesses); lockdProc is then lockd's `lockd serve` child.
	own       bool
	lockdProc *child
	// noStatsProc is lockd-nostats' `lockd serve` child (Config.StatsOffRows).
	noStatsProc *child
	// lockdAddr is lockd's server's address (the child's or this
	// process's): the SDK rows' workers connect to it.
	lockdAddr string

	srv      *server.Server
	served   chan error
	lockd    *client.Client
	systems  []system // lockd first, then the primary baseline
	ceilings []ceiling
	// electors are the election scenario's systems: lockd first, then the
	// primary baseline.
	electors []elector
	// semaphorers are the semaphore scenario's systems: lockd first, then
	// the raw baseline.
	semaphorers []semaphorer

	closers []func(context.Context) error // run in reverse order by close
}

// newBed starts or connects to the backend of cfg and starts lockd on it.
// On error everything started so far is stopped again.
func newBed(ctx context.Context, cfg Config) (b *bed, err error) {
	b = &bed{run: strings.ToLower(rand.Text()[:8]), own: ownProcesses(cfg)}
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
	maxLocks := 0
	for _, n := range cfg.DeathLocks {
		maxLocks = max(maxLocks, n)
	}
	if b.own {
		if err := b.startLockdProcess(ctx, cfg, etcdLockdPrefix+b.run+"/", maxLocks); err != nil {
			return b, err
		}
		if cfg.StatsOffRows {
			return b, b.startLockdNoStats(ctx, cfg, etcdLockdPrefix+b.run+"/", maxLocks)
		}
		return b, nil
	}
	if err := b.startLockd(st, maxLocks); err != nil {
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

// ownDataDir returns cfg.DataDir, or a temporary directory removed at
// close.
func (b *bed) ownDataDir(cfg Config) (string, error) {
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return "", fmt.Errorf("data dir: %w", err)
		}
		return cfg.DataDir, nil
	}
	tmp, err := os.MkdirTemp("", "lockd-bench-")
	if err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	b.onClose(func(context.Context) error { return os.RemoveAll(tmp) })
	return tmp, nil
}

func (b *bed) startEtcd(ctx context.Context, cfg Config) (store.LockStore, error) {
	// lockd's backend, as `lockd serve` opens it.
	lockdPrefix := etcdLockdPrefix + b.run + "/"
	bcfg := backend.DefaultConfig()
	bcfg.Kind, bcfg.EtcdEndpoints, bcfg.EtcdPrefix, bcfg.EtcdDialTimeout = cfg.Backend, cfg.EtcdEndpoints, lockdPrefix, dialTimeout
	var err error
	switch {
	case cfg.Backend == BackendEmbedded:
		if bcfg.EmbeddedDataDir, err = b.ownDataDir(cfg); err != nil {
			return nil, err
		}
		b.dataDir = bcfg.EmbeddedDataDir
		b.process = "etcd embedded in the bench process (one Go runtime with lockd and the baselines' clients)"
		b.durability = etcdDurability
	case len(cfg.EtcdEndpoints) == 0:
		// etcd in a process of its own: the hidden `lockd bench etcd-server`.
		if b.dataDir, err = b.ownDataDir(cfg); err != nil {
			return nil, err
		}
		ch, err := startChild(ctx, cfg.LockdCommand, append(slices.Clone(EtcdServerCommand), "--data-dir", b.dataDir), etcdServingLine)
		if err != nil {
			return nil, fmt.Errorf("start etcd: %w", err)
		}
		b.onClose(func(context.Context) error { ch.stop(); return nil }) // after everything that uses it
		b.etcdProc = ch
		bcfg.EtcdEndpoints = []string{ch.addr}
		b.process = fmt.Sprintf("etcd in its own process (pid %d, `lockd %s`), spawned by the bench", ch.pid(), strings.Join(EtcdServerCommand, " "))
		b.durability = etcdDurability
	default:
		b.process = "external etcd at " + strings.Join(cfg.EtcdEndpoints, ",")
		b.durability = "etcd: unknown (external; see its --unsafe-no-fsync)"
		if b.dataDir, err = b.ownDataDir(Config{}); err != nil {
			return nil, err
		}
		b.dataDirNote = "a temporary directory: the external etcd's data directory is not known here"
	}
	var lb *backend.Backend
	if b.own {
		b.endpoints = bcfg.EtcdEndpoints // lockd's server is a child of its own (startLockdProcess)
	} else {
		withLabel(sysLockd, func() { lb, err = backend.Open(ctx, bcfg, nil, nil) })
		if err != nil {
			return nil, err
		}
		b.onClose(func(context.Context) error { return lb.Close() })
		b.endpoints = lb.Endpoints()
	}

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
		for _, p := range []string{etcdLockdPrefix, etcdRawPrefix, etcdMutexPrefix, etcdElectPrefix, etcdSemPrefix, etcdIdlePrefix, etcdCeilPrefix, etcdFailoverPrefix} {
			if _, err := raw.Delete(ctx, p+b.run+"/", clientv3.WithPrefix()); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", p+b.run+"/", err))
			}
		}
		return errors.Join(errs...)
	})
	if lb != nil {
		// The store stops before its keys are deleted; lb.Close closes it
		// again (a no-op), then its client and the embedded etcd.
		b.onClose(func(context.Context) error { return lb.LockStore.Close() })
	}

	lockd := &lockdSystem{count: func(ctx context.Context, prefix string) (int64, error) {
		resp, err := raw.Get(ctx, lockdPrefix+"l/"+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return resp.Count, nil
	}}
	txn := &etcdTxnSystem{cli: raw, prefix: etcdRawPrefix + b.run + "/"}
	b.systems = []system{lockd, txn, &etcdMutexSystem{cli: raw, prefix: etcdMutexPrefix + b.run + "/"}}
	b.electors = []elector{lockd, &etcdElectionSystem{cli: raw, prefix: etcdElectPrefix + b.run + "/"}, txn}
	b.semaphorers = []semaphorer{lockd, &etcdSemSystem{etcdTxnSystem{cli: raw, prefix: etcdSemPrefix + b.run + "/"}}}
	b.ceilings = []ceiling{fsyncCeiling(b.dataDir), etcdPutCeiling(raw, etcdCeilPrefix+b.run+"/")}
	if lb == nil {
		return nil, nil
	}
	return lb, nil
}

func (b *bed) startPG(ctx context.Context, cfg Config) (store.LockStore, error) {
	b.dsn = cfg.PGDSN
	pcfg, err := pgxpool.ParseConfig(cfg.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("parse --pg-dsn: %w", err)
	}
	// pgxpool's size from this DSN: lockd's pgstore pool and pg-raw-defpool's.
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
	b.process = "PostgreSQL server process(es), " + pcfg.ConnConfig.Host
	var settings []string
	for _, name := range []string{"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "commit_delay"} {
		var v string
		if err := pool.QueryRow(dctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			v = "unknown"
		}
		settings = append(settings, name+"="+v)
	}
	b.durability = "pg " + strings.Join(settings, " ")
	b.dataDir, b.dataDirNote = b.pgFsyncDir(dctx, pool)
	drop := func(ctx context.Context) error {
		for _, s := range []string{pgLockdSchema, pgRawSchema, pgIdleSchema, pgMinSchema, pgFailoverSchema} {
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
	full, minimal := newPGRawQueries(pgRawSchema, false), newPGRawQueries(pgMinSchema, true) // as newPGRawSystem's
	for _, ddl := range slices.Concat(full.schema, minimal.schema, []string{pgCeilingDDL(pgRawSchema)}) {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return nil, fmt.Errorf("create the baselines' schemas: %w", err)
		}
	}
	// lockd's backend, as `lockd serve` opens it.
	bcfg := backend.DefaultConfig()
	bcfg.Kind, bcfg.PGDSN, bcfg.PGSchema = BackendPG, cfg.PGDSN, pgLockdSchema
	b.lockdConns = bcfg.PGMaxConns
	var st store.LockStore
	if !b.own { // else lockd's server is a child of its own (startLockdProcess)
		var lb *backend.Backend
		withLabel(sysLockd, func() { lb, err = backend.Open(ctx, bcfg, nil, nil) })
		if err != nil {
			return nil, err
		}
		b.onClose(func(context.Context) error { return lb.Close() })
		st = lb
	}
	countQ := `SELECT count(*) FROM ` + pgx.Identifier{pgLockdSchema}.Sanitize() + `.locks WHERE starts_with(key, $1)`
	lockd := &lockdSystem{count: func(ctx context.Context, prefix string) (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, countQ, prefix).Scan(&n)
		return n, err
	}}
	pgRaw := newPGRawSystem(sysPGRaw, pcfg, pool)
	b.electors = []elector{lockd, pgRaw}
	b.semaphorers = []semaphorer{lockd, newPGRawSystem(sysPGSem, pcfg, pool)}
	b.systems = []system{lockd, pgRaw, newPGRawSystem(sysPGRawMin, pcfg, pool), newPGRawSystem(sysPGRawDef, pcfg, pool)}
	b.ceilings = []ceiling{fsyncCeiling(b.dataDir), pgInsertCeiling(pcfg, pgRawSchema)}
	return st, nil
}

// pgFsyncDir returns a directory on PostgreSQL's data directory for the
// fsync ceiling (removed at close) when the server's data directory is on
// this machine and writable by this user, else a temporary directory and
// the reason.
func (b *bed) pgFsyncDir(ctx context.Context, pool *pgxpool.Pool) (dir, note string) {
	var data string
	err := pool.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&data)
	if err == nil {
		if dir, err = os.MkdirTemp(data, "lockd-bench-fsync-"); err == nil {
			b.onClose(func(context.Context) error { return os.RemoveAll(dir) })
			return dir, ""
		}
	}
	tmp, terr := b.ownDataDir(Config{})
	if terr != nil {
		tmp = os.TempDir()
	}
	return tmp, fmt.Sprintf("a temporary directory: PostgreSQL's data directory is not usable from here (%v)", err)
}

// startLockd starts the lockd server over st on 127.0.0.1 and connects the
// SDK client to it. Its lock.server.max-locks-per-session admits the largest
// death scenario (maxLocks locks in one session, taken setupWidth at once).
func (b *bed) startLockd(st store.LockStore, maxLocks int) (err error) {
	withLabel(sysLockd, func() { err = b.startLockdLabelled(st, maxLocks) })
	return err
}

func (b *bed) startLockdLabelled(st store.LockStore, maxLocks int) error {
	cfg := server.DefaultConfig()
	cfg.MaxLocksPerSession = maxLocksPerSession(maxLocks)
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
	b.lockdAddr = lis.Addr().String()
	c, err := client.New(b.lockdAddr)
	if err != nil {
		return fmt.Errorf("lockd client: %w", err)
	}
	b.lockd = c
	b.onClose(func(context.Context) error { return c.Close() })
	b.systems[0].(*lockdSystem).c = c
	return nil
}

// maxLocksPerSession is lockd's lock.server.max-locks-per-session for a
// death scenario of at most maxLocks locks: the headroom of its acquire
// width, since the server counts a granted Acquire both as held and as in
// progress until the call returns, so at the limit a concurrent acquire can
// be refused (a run of TestBenchSmoke was, at 1030 of 1030).
func maxLocksPerSession(maxLocks int) int {
	return max(server.DefaultConfig().MaxLocksPerSession, maxLocks+setupWidth)
}

// etcdWritable waits until etcd accepts a write of key (an empty value),
// retrying its transient refusals, e.g. "too many requests" while it
// applies a burst of revokes.
func (b *bed) etcdWritable(ctx context.Context, key string) error {
	var retry retrier
	for {
		_, err := b.etcd.Put(ctx, key, "")
		if !retry.retried(ctx, err) {
			if err != nil {
				return fmt.Errorf("etcd not writable: %w", err)
			}
			return nil
		}
	}
}
