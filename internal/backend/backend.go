package backend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/tlsreload"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
	"lock.dev/lockd/store/pgstore"
)

// ProfileLabel is the pprof label key, and ProfileEmbedded its value, on
// the goroutines of the embedded etcd server.
const (
	ProfileLabel    = "system"
	ProfileEmbedded = "backend"
)

// Backend is an open backend: the store, whose methods it promotes, and
// what the store runs on. Close closes all of it (see the package doc for
// the order). It is safe for concurrent use.
type Backend struct {
	store.LockStore

	label     string
	endpoints []string
	embedded  *embedetcd.Server                // backend embedded
	etcd      *clientv3.Client                 // backends embedded and etcd
	etcdTLS   *tlsreload.Reloader[*tls.Config] // lock.etcd.tls.*; nil when unset

	closeOnce sync.Once
	closeErr  error
}

var (
	_ store.LockStore        = (*Backend)(nil)
	_ store.HeartbeatBatcher = (*Backend)(nil)
)

// HeartbeatMany implements store.HeartbeatBatcher (C2 #ct2-heartbeat-many):
// the store's own where it has one (PostgreSQL: one renewal statement),
// else Heartbeat of every id, concurrently (etcd: Heartbeat sends nothing).
func (b *Backend) HeartbeatMany(ctx context.Context, ids []store.SessionID) ([]store.Liveness, []error) {
	if hb, ok := b.LockStore.(store.HeartbeatBatcher); ok {
		return hb.HeartbeatMany(ctx, ids)
	}
	lvs := make([]store.Liveness, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() { // exits when this Heartbeat returns (waited for below)
			defer wg.Done()
			lvs[i], errs[i] = b.LockStore.Heartbeat(ctx, id)
		}()
	}
	wg.Wait()
	return lvs, errs
}

// Open validates cfg and opens the backend it names: it starts the embedded
// etcd server if lock.backend=embedded, connects to etcd or PostgreSQL and
// opens the store. logger receives the store's C4 events and etcd's own
// warnings (nil discards them); metrics, if not nil, records the store's C4
// metrics and must carry the label cfg.Label(). On error, whatever was
// started is closed again.
func Open(ctx context.Context, cfg Config, logger *slog.Logger, metrics *telemetry.Metrics) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("backend: invalid config: %w", err)
	}
	b := &Backend{label: cfg.Label()}
	var err error
	switch cfg.Kind {
	case PG:
		dsn, err := cfg.pgDSN()
		if err != nil {
			return nil, fmt.Errorf("backend: %w", err)
		}
		checkPGTLS(dsn, logger)
		b.LockStore, err = pgstore.New(ctx, pgstore.Options{DSN: dsn, Schema: cfg.PGSchema,
			ReaperInterval: cfg.PGReaperInterval, MaxConns: cfg.PGMaxConns, Logger: logger, Metrics: metrics})
		if err != nil {
			// The DSN's password never reaches an error text (C5 #ct5-tls).
			return nil, redact(fmt.Errorf("open postgresql store (lock.pg.dsn): %w", err), pgPassword(dsn))
		}
		return b, nil
	case Embedded:
		dir, fresh, derr := prepareDataDir(cfg.EmbeddedDataDir)
		if derr != nil {
			return nil, fmt.Errorf("start embedded etcd in %s (lock.embedded.data-dir): %w", cfg.EmbeddedDataDir, derr)
		}
		telemetry.OrDiscard(logger).Info(telemetry.EventEmbeddedDataDir, "dir", dir, "created", fresh)
		b.embedded, err = startEmbedded(ctx, embedetcd.Config{DataDir: dir, Socket: true, Logger: logger,
			QuotaBytes: cfg.EmbeddedQuotaBytes, CompactionRetainRevisions: cfg.EmbeddedCompactionRetainRevisions})
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd in %s (lock.embedded.data-dir): %w", cfg.EmbeddedDataDir, err)
		}
		b.endpoints = b.embedded.Endpoints()
	case Etcd:
		b.endpoints = append([]string(nil), cfg.EtcdEndpoints...)
	}
	if err := b.openEtcd(ctx, cfg, logger, metrics); err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return b, nil
}

// startEmbedded starts the embedded etcd with the pprof label
// ProfileLabel=ProfileEmbedded, which its goroutines inherit. It starts it
// from a goroutine of its own because pprof.Do resets the caller's labels
// to ctx's afterwards, and the caller's (for example `lockd bench`'s) must
// stay on the client and store opened next.
func startEmbedded(ctx context.Context, cfg embedetcd.Config) (s *embedetcd.Server, err error) {
	done := make(chan struct{})
	go func() { // exits when Start returns
		defer close(done)
		pprof.Do(ctx, pprof.Labels(ProfileLabel, ProfileEmbedded), func(ctx context.Context) {
			s, err = embedetcd.Start(ctx, cfg)
		})
	}()
	<-done
	return s, err
}

// openEtcd connects a clientv3 client to b.endpoints and opens an etcdstore
// over it.
func (b *Backend) openEtcd(ctx context.Context, cfg Config, logger *slog.Logger, metrics *telemetry.Metrics) error {
	ccfg := etcdstore.ClientConfig(b.endpoints, cfg.EtcdDialTimeout)
	ccfg.Logger = embedetcd.ZapLogger(logger)
	if cfg.Kind == Etcd {
		// Follow the cluster's members (C5 #ct5-etcd-members): the client's
		// own loop, stopped by Close, replaces the endpoints with the
		// member list. The embedded etcd is one member, lockd's own.
		ccfg.AutoSyncInterval = cfg.EtcdAutoSyncInterval
	}
	var err error
	if b.etcdTLS, err = cfg.etcdTLS(logger); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	if b.etcdTLS != nil {
		// TLS makes clientv3 treat the endpoints as TLS ones; the dial
		// option, applied after clientv3's own credentials (clientv3
		// appends Config.DialOptions last), makes every handshake use the
		// files in force (etcdCreds).
		ccfg.TLS = b.etcdTLS.Current()
		ccfg.DialOptions = append(ccfg.DialOptions, grpc.WithTransportCredentials(etcdCreds{files: b.etcdTLS}))
	}
	var password string
	if cfg.EtcdUsername != "" {
		if password, err = readSecret("lock.etcd.password-file", cfg.EtcdPasswordFile); err != nil {
			return fmt.Errorf("backend: %w", err)
		}
		ccfg.Username, ccfg.Password = cfg.EtcdUsername, password
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return redact(fmt.Errorf("connect to etcd %v (lock.etcd.endpoints): %w", b.endpoints, err), password)
	}
	b.etcd = cli
	dctx, cancel := context.WithTimeout(ctx, cfg.EtcdDialTimeout)
	defer cancel()
	st, err := openRetrying(dctx, func(ctx context.Context) (*etcdstore.Store, error) {
		return etcdstore.New(ctx, cli, etcdstore.Options{Prefix: cfg.EtcdPrefix, Logger: logger, Metrics: metrics, Exclusive: cfg.Kind == Embedded})
	})
	if err != nil {
		return redact(fmt.Errorf("open etcd store at %v (lock.etcd.endpoints): %w", b.endpoints, err), password)
	}
	b.LockStore = st
	return nil
}

// ReloadTLS re-reads the lock.etcd.tls.* files now, changed or not
// (SIGHUP); the next new connection to etcd uses them. It is nil when the
// backend has no such files. On error the previous files stay in force
// (and it is logged as tls_reload_failed, C4).
func (b *Backend) ReloadTLS() error {
	if b.etcdTLS == nil {
		return nil
	}
	return b.etcdTLS.Reload()
}

// Label is the C4 backend label: "etcd" or "pg".
func (b *Backend) Label() string { return b.label }

// Endpoints returns the etcd client URLs the store uses now: the embedded
// server's, or lock.etcd.endpoints until the client replaces them with the
// cluster's member list (lock.etcd.auto-sync-interval, C5
// #ct5-etcd-members); nil for PostgreSQL.
func (b *Backend) Endpoints() []string {
	if b.etcd != nil {
		return b.etcd.Endpoints()
	}
	return append([]string(nil), b.endpoints...)
}

// Close closes the store, then the etcd client, then the embedded etcd
// server. Calling it again returns the first call's result.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		var errs []error
		if b.LockStore != nil {
			if err := b.LockStore.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close store: %w", err))
			}
		}
		if b.etcd != nil {
			if err := b.etcd.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close etcd client: %w", err))
			}
		}
		if b.embedded != nil {
			if err := b.embedded.Close(); err != nil {
				errs = append(errs, fmt.Errorf("stop embedded etcd: %w", err))
			}
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// openRetrying calls open until it succeeds, fails for good, or ctx ends
// (lock.etcd.dial-timeout, C5): a backend that answers with a transient
// refusal at start — no leader yet, "too many requests" while it applies a
// burst — is waited for rather than ending lockd. It returns the last error.
func openRetrying[S any](ctx context.Context, open func(context.Context) (S, error)) (S, error) {
	wait := 20 * time.Millisecond
	for {
		st, err := open(ctx)
		if err == nil || !store.IsRetryable(err) {
			return st, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return st, err
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
