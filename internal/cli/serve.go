package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/config"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/server"
)

// shutdownTimeout bounds the graceful part of shutdown (in-flight RPCs,
// closing sessions when asked to); what is still running then is cut off.
const shutdownTimeout = 30 * time.Second

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

  lockd serving grpc=HOST:PORT metrics=HOST:PORT backend=NAME[ http=HOST:PORT]

With --http-listen it also serves the same API as HTTP/1.1 + JSON (routes in
docs/contracts/C2.md #ct2-http, OpenAPI in proto/lockd/v1/lockd.swagger.json),
with the gRPC listener's TLS and the same access rules.
With --http-console as well, it serves the read-only web console on that
listener under /console/ (docs/contracts/C5.md #ct5-console).

Logs (C4 events) are JSON lines on stderr, net/http's and gRPC's own lines
included (rate-limited). SIGINT or SIGTERM shuts it down:
sessions are left to expire unless --close-sessions-on-shutdown.

TLS: --tls-cert-file and --tls-key-file serve the gRPC API over TLS; add
--tls-client-ca-file to require client certificates (mTLS). The metrics
listener has its own --metrics-tls-* flags. Certificate files, the
--etcd-tls-* ones included, are re-read when they change and on SIGHUP. A listen address that is not loopback needs
TLS, or --insecure-allow-remote (docs/contracts/C5.md #ct5-tls); with TLS it also
needs --tls-client-ca-file or --auth-policy-file, since otherwise every caller
is an anonymous admin (#ct5-unsafe). A connection that makes no allowed call
within --conn-auth-timeout is closed (#ct5-idle).`,
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

// serve runs lockd until ctx ends or a listener fails.
func serve(ctx context.Context, cfg config.Config, e *env) (err error) {
	// C4 #ct4-log-delivery: the lines go to stderr from the LogWriter's
	// goroutine, those logged during a write together in the next one.
	// Deferred first, so closed last: every line logged before serve
	// returns is written by then. A line stderr refuses is not an error of
	// the service.
	logw := telemetry.NewLogWriter(e.stderr)
	defer logw.Close() //nolint:errcheck // C4: a failed log write is not serve's error
	logger := slog.New(slog.NewJSONHandler(logw, nil))
	reg := prometheus.NewRegistry() // never the global one: embedded etcd pollutes that
	label := cfg.Backend.Label()
	metrics, err := telemetry.NewMetrics(reg, label)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	// net/http's and grpc-go's own log lines as C4 events (cmd/lockd
	// installs server.GRPCLogger).
	tlog, err := server.NewTransportLog(logger, reg)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	tlog.ReceiveGRPCLogs()

	// Access rules (C5 #ct5-auth): read before the backend opens, so a bad
	// policy fails the start at once; re-read on change and SIGHUP (below).
	az, err := auth.New(cfg.Auth, auth.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer az.Close()

	b, err := backend.Open(ctx, cfg.Backend, logger, metrics)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.Close()) }()

	if cfg.Server.TracingEnabled {
		routeTracingErrors(logger)
	}
	srv, err := server.New(cfg.Server, b, server.Options{Logger: logger, Registry: reg, Metrics: metrics, BackendLabel: label, Auth: az, TransportLog: tlog})
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

	lis, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return errors.Join(fmt.Errorf("lock.server.listen: %w", err), shutdown())
	}
	var (
		httpSrv   *http.Server
		mlis      net.Listener
		metricsAt = server.MetricsOff
	)
	if cfg.Server.MetricsListen != server.MetricsOff {
		mlis, err = net.Listen("tcp", cfg.Server.MetricsListen)
		if err != nil {
			return errors.Join(fmt.Errorf("lock.server.metrics-listen: %w", err), lis.Close(), shutdown())
		}
		if tc := srv.MetricsTLSConfig(); tc != nil {
			mlis = tls.NewListener(mlis, tc)
		}
		httpSrv = &http.Server{Handler: srv.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: tlog.HTTPErrorLog(telemetry.ListenerMetrics)}
		metricsAt = mlis.Addr().String()
	}

	var hlis net.Listener // the HTTP/JSON API (C5 #ct5-http); nil when off
	if cfg.Server.HTTPListen != "" {
		if hlis, err = net.Listen("tcp", cfg.Server.HTTPListen); err != nil {
			errs := []error{fmt.Errorf("lock.server.http.listen: %w", err), lis.Close()}
			if mlis != nil {
				errs = append(errs, mlis.Close())
			}
			return errors.Join(append(errs, shutdown())...)
		}
	}

	// SIGHUP re-reads the TLS certificates, keys and client CAs of the
	// listeners and of the etcd client (lock.etcd.tls.*) and the access
	// policy and tokens (all also re-read when they change on disk); the
	// reloaders log the outcome (C4 tls_reloaded, auth_reloaded and their
	// _failed events).
	stopHUP := onSIGHUP(func() {
		_ = srv.ReloadTLS()
		_ = b.ReloadTLS()
		_ = az.Reload()
	})
	defer stopHUP()

	// The serve goroutines end at shutdown below; errc holds their results.
	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(lis) }()
	running := 1
	httpAt := ""
	if hlis != nil {
		running++
		httpAt = " http=" + hlis.Addr().String()
		go func() {
			if err := srv.ServeHTTPAPI(hlis); err != nil {
				errc <- fmt.Errorf("serve HTTP/JSON API: %w", err)
				return
			}
			errc <- nil
		}()
	}
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
	logw.Flush() // the start's lines before the serving line (C4 #ct4-log-delivery)
	fmt.Fprintf(e.stdout, "lockd serving grpc=%s metrics=%s backend=%s%s\n", lis.Addr(), metricsAt, cfg.Backend.Kind, httpAt)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc: // a listener failed (Serve returns nil only after Shutdown)
		running--
		if serveErr == nil {
			serveErr = errors.New("a listener stopped")
		}
	}
	// Order: the gRPC server and the HTTP/JSON API (so /healthz reports 503
	// while they drain), then
	// the metrics server, then (deferred) the backend: the store, the etcd
	// client and the embedded etcd (backend.Backend.Close).
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

// onSIGHUP calls reload on every SIGHUP the process receives until the
// returned function is called; that function stops the goroutine and waits
// for it (and a reload in progress) to end.
func onSIGHUP(reload func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() { // exits when stop closes done
		defer close(exited)
		for {
			select {
			case <-hup:
				reload()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-exited
	}
}
