package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/config"
	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
	"lock.dev/lockd/store/pgstore"
)

// shutdownTimeout bounds the graceful part of shutdown (in-flight RPCs,
// closing sessions when asked to); what is still running then is cut off.
const shutdownTimeout = 30 * time.Second

// metricsOff is the lock.server.metrics-listen value that disables /metrics.
const metricsOff = "off"

func newServeCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the lock service (embedded etcd by default; see --help for every setting)",
		Long: `Serve runs lockd: the gRPC lock service on --listen and /metrics and /healthz
on --metrics-listen, over the backend chosen by --backend (default: an etcd
embedded in this process, data in --data-dir).

Configuration comes from flags, then LOCKD_* environment variables, then the
YAML file given with --config, then the defaults (docs/contracts/C5.md). Once
listening it prints one line to stdout:

  lockd serving grpc=HOST:PORT metrics=HOST:PORT backend=NAME

Logs (C4 events) are JSON lines on stderr. SIGINT or SIGTERM shuts it down:
sessions are left to expire unless --close-sessions-on-shutdown.`,
		Args: exactArgs(0, "no arguments"),
	}
	config.RegisterFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := config.Load(cmd.Flags(), e.environ)
		if err != nil {
			return fmt.Errorf("configuration:\n%w", err)
		}
		return serve(cmd.Context(), cfg, e)
	}
	return cmd
}

// backend is a running store and what it needs closed, in order.
type backend struct {
	store  store.LockStore
	label  string         // C4 backend label
	closes []func() error // run in order after the store's Close
}

func (b *backend) close() error {
	var errs []error
	if b.store != nil {
		if err := b.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	for _, c := range b.closes {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// serve runs lockd until ctx ends or a listener fails.
func serve(ctx context.Context, cfg server.Config, e *env) (err error) {
	logger := slog.New(slog.NewJSONHandler(e.stderr, nil))
	reg := prometheus.NewRegistry() // never the global one: embedded etcd pollutes that
	label := telemetryLabel(cfg.Backend)
	metrics, err := telemetry.NewMetrics(reg, label)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}

	b, err := openBackend(ctx, cfg, logger, metrics)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.close()) }()

	srv, err := server.New(cfg, b.store, server.Options{Logger: logger, Registry: reg, Metrics: metrics, BackendLabel: label})
	if err != nil {
		return fmt.Errorf("start server: %w", err)
	}
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("shut down server: %w", err)
		}
		return nil
	}

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errors.Join(fmt.Errorf("lock.server.listen: %w", err), shutdown())
	}
	var (
		httpSrv   *http.Server
		mlis      net.Listener
		metricsAt = metricsOff
	)
	if cfg.MetricsListen != metricsOff {
		mlis, err = net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return errors.Join(fmt.Errorf("lock.server.metrics-listen: %w", err), lis.Close(), shutdown())
		}
		httpSrv = &http.Server{Handler: srv.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		metricsAt = mlis.Addr().String()
	}

	// Both serve goroutines end at shutdown below; errc holds their results.
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(lis) }()
	running := 1
	if httpSrv != nil {
		running++
		go func() {
			if err := httpSrv.Serve(mlis); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve metrics: %w", err)
				return
			}
			errc <- nil
		}()
	}
	fmt.Fprintf(e.stdout, "lockd serving grpc=%s metrics=%s backend=%s\n", lis.Addr(), metricsAt, cfg.Backend)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc: // a listener failed (Serve returns nil only after Shutdown)
		running--
		if serveErr == nil {
			serveErr = errors.New("metrics server stopped")
		}
	}
	// Order: the gRPC server (so /healthz reports 503 while it drains), then
	// the metrics server, then (deferred) the store, the etcd client and the
	// embedded etcd.
	errs := []error{serveErr, shutdown()}
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		errs = append(errs, httpSrv.Shutdown(sctx))
		cancel()
	}
	for ; running > 0; running-- {
		if err := <-errc; err != nil && serveErr == nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// telemetryLabel is the C4 backend label of a lock.backend value: the
// embedded backend is etcd.
func telemetryLabel(b string) string {
	if b == server.BackendPG {
		return server.BackendPG
	}
	return server.BackendEtcd
}

// openBackend starts the configured backend and opens a store on it.
func openBackend(ctx context.Context, cfg server.Config, logger *slog.Logger, m *telemetry.Metrics) (*backend, error) {
	b := &backend{label: telemetryLabel(cfg.Backend)}
	switch cfg.Backend {
	case server.BackendPG:
		st, err := pgstore.New(ctx, pgstore.Options{DSN: cfg.PGDSN, Schema: cfg.PGSchema,
			ReaperInterval: cfg.PGReaperInterval, Logger: logger, Metrics: m})
		if err != nil {
			return nil, fmt.Errorf("open postgresql store (lock.pg.dsn): %w", err)
		}
		b.store = st
		return b, nil
	case server.BackendEmbedded:
		ee, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: cfg.EmbeddedDataDir, Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd in %s (lock.embedded.data-dir): %w", cfg.EmbeddedDataDir, err)
		}
		b.closes = append(b.closes, ee.Close)
		if err := b.openEtcd(ctx, ee.Endpoints(), cfg, logger, m); err != nil {
			return nil, errors.Join(err, b.close())
		}
		return b, nil
	case server.BackendEtcd:
		if err := b.openEtcd(ctx, cfg.EtcdEndpoints, cfg, logger, m); err != nil {
			return nil, errors.Join(err, b.close())
		}
		return b, nil
	}
	return nil, fmt.Errorf("lock.backend: unknown backend %q", cfg.Backend)
}

// openEtcd connects a clientv3 client to endpoints and opens an etcdstore
// over it. The client is closed after the store, before anything closed
// earlier in b.closes (the embedded server).
func (b *backend) openEtcd(ctx context.Context, endpoints []string, cfg server.Config, logger *slog.Logger, m *telemetry.Metrics) error {
	ccfg := etcdstore.ClientConfig(endpoints, cfg.EtcdDialTimeout)
	ccfg.Logger = embedetcd.ZapLogger(logger)
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return fmt.Errorf("connect to etcd %v (lock.etcd.endpoints): %w", endpoints, err)
	}
	b.closes = append([]func() error{cli.Close}, b.closes...)
	dctx, cancel := context.WithTimeout(ctx, cfg.EtcdDialTimeout)
	defer cancel()
	st, err := etcdstore.New(dctx, cli, etcdstore.Options{Prefix: cfg.EtcdPrefix, Logger: logger, Metrics: m})
	if err != nil {
		return fmt.Errorf("open etcd store at %v (lock.etcd.endpoints): %w", endpoints, err)
	}
	b.store = st
	return nil
}
