package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server/internal/estimate"
	"lock.dev/lockd/server/internal/hotkeys"
	"lock.dev/lockd/server/internal/prefixstats"
	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// Limits of the server (documented in the package doc).
const (
	// MaxRecvMsgSize bounds one request message.
	MaxRecvMsgSize = 64 << 10
	// MaxWait bounds how long one Acquire may wait (wait_timeout_ms 0
	// means MaxWait).
	MaxWait = 10 * time.Minute
	// MaxSessionsPerStream bounds the sessions one KeepAlive stream
	// carries.
	MaxSessionsPerStream = 10000
	// MaxInflightPerStream bounds the heartbeats of one KeepAlive stream
	// being answered at once; further requests wait to be read.
	MaxInflightPerStream = 64
	// MaxKeepAliveBatch bounds the entries of one batched KeepAlive
	// request, the batch_max the server advertises (C2
	// #ct2-keepalive-batch). At most MaxInflightPerStream: a whole batch
	// can be in flight at once.
	MaxKeepAliveBatch = 64
)

// Transport settings of the gRPC server (see New).
const (
	// streamWindow and connWindow are static HTTP/2 flow-control windows.
	// A static window turns off grpc-go's bandwidth-delay estimation,
	// which otherwise sends a PING (and reads its ack) when data arrives
	// while no estimation PING is outstanding (the measured saving is in
	// docs/backends.md). Messages are at most MaxRecvMsgSize, far below
	// either window.
	streamWindow = 1 << 20
	connWindow   = 16 << 20
	// streamWorkers is how many goroutines serve RPCs and keep their grown
	// stacks between RPCs; above it grpc-go starts a goroutine per RPC
	// as it does by default.
	streamWorkers = 64
)

// Options are the server's dependencies. The zero value is valid.
type Options struct {
	// Logger receives the C4 log events; nil discards them.
	Logger *slog.Logger
	// Registry is lockd's own Prometheus registry, served by
	// MetricsHandler; nil creates a new one.
	Registry *prometheus.Registry
	// Metrics are the C4 metrics. nil creates them on Registry with the
	// backend label BackendLabel. A caller that shares one Metrics between
	// the store and the server passes it here, registered on Registry.
	Metrics *telemetry.Metrics
	// BackendLabel is the C4 backend label of the store ("etcd" or "pg",
	// as internal/backend reports it); empty means "etcd", the label of the
	// default (embedded) backend.
	BackendLabel string
	// Auth decides every call against lockd's access rules (server/auth.go,
	// C5 #ct5-auth); nil allows every call. It stays the caller's: Shutdown
	// does not close it.
	Auth *auth.Authorizer
	// TransportLog receives net/http's own error log lines (translog.go);
	// nil makes one over Logger and Registry.
	TransportLog *TransportLog
	// TraceExporter, when not nil and lock.server.tracing.enabled is true,
	// receives the spans synchronously instead of the OTLP exporter (tests).
	TraceExporter sdktrace.SpanExporter
}

// Server is a lockd gRPC server over one store.
type Server struct {
	cfg      Config
	st       store.LockStore
	log      *slog.Logger
	tlog     telemetry.Log
	metrics  *telemetry.Metrics
	stats    *prefixstats.Stats // per-template waits, holds, queues (C4 #ct4-template-stats)
	hot      *hotkeys.Keys      // the hot keys (C4 #ct4-hotkeys); nil when stats are off
	est      *estimate.Holds    // recent holds for wait estimates (C2 #ct2-wait-estimate); nil when stats are off
	reg      *prometheus.Registry
	grpc     *grpc.Server
	health   *health.Server
	bad      badRequests              // requests that failed to decode on invalid UTF-8 (codec.go)
	lim      *limits                  // the limits of C2 #ct2-limits (limits.go)
	refused  *refusals                // the refusal rate per peer (refusals.go)
	guard    *connGuard               // closes connections without an authorised call (idle.go)
	translog *TransportLog            // net/http's error log as C4 events (translog.go)
	plim     *principalLimits         // per-principal shares (principal_limits.go)
	tokens   tokenIndex               // CheckToken's cached mode (tokenindex.go), fed by lostLoop
	tp       *sdktrace.TracerProvider // nil: tracing off (tracing.go, C5 #ct5-tracing)

	grpcTLS, metricsTLS, httpTLS *TLSReloader // nil: plaintext listener (tls.go)
	http                         *httpAPI     // the HTTP/JSON API (http.go); nil when off

	// ctx ends when Shutdown begins; every background goroutine and every
	// long-running handler (waits, streams) watches it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines and stream helpers

	// sess is the session table (internal/sessions): every session's
	// state, the silence loop, the limits' session counts, tracking,
	// notices and the KeepAlive stream registry.
	sess *sessions.Table

	// maxWait bounds one Acquire's wait in nanoseconds (MaxWait; tests
	// shorten it while the server runs: export_test.go).
	maxWait atomic.Int64

	// afterAcquireTrack, set by tests (export_test.go), runs in Acquire
	// after the grant's tracking critical section and before the reply,
	// with the granted key: it holds that window open.
	afterAcquireTrack atomic.Pointer[func(key string)]

	shutdownOnce sync.Once
	shutdownErr  error
}

// New validates cfg and returns a server over st. It starts the server's
// background goroutines (the silence closer and the lock-loss router);
// Shutdown stops them, so call Shutdown even if Serve is never called. The
// store stays the caller's: Shutdown does not close it.
func New(cfg Config, st store.LockStore, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server: invalid config: %w", err)
	}
	if st == nil {
		return nil, errors.New("server: nil store")
	}
	label := opts.BackendLabel
	if label == "" {
		label = "etcd"
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := opts.Metrics
	if m == nil {
		var err error
		if m, err = telemetry.NewMetrics(reg, label); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	lm, err := telemetry.NewLimitMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	tm, err := telemetry.NewTransportMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	// Under an access policy the default's first segments would show
	// every principal's to whoever reads /metrics: other (C4
	// #ct4-template-stats).
	var stats *prefixstats.Stats // nil: off (lock.server.stats.enabled)
	var hot *hotkeys.Keys
	var est *estimate.Holds
	if cfg.StatsEnabled {
		hot, est = hotkeys.New(nil), estimate.New()
		if stats, err = prefixstats.New(reg, cfg.StatsTemplates, opts.Auth.Policy() == nil); err != nil {
			return nil, fmt.Errorf("server: lock.server.stats.templates: %w", err)
		}
	}
	log := telemetry.OrDiscard(opts.Logger)
	tl := opts.TransportLog
	if tl == nil {
		if tl, err = NewTransportLog(log, reg); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	s := &Server{
		lim:      newLimits(cfg, lm),
		refused:  newRefusals(cfg.RefusalRate),
		guard:    newConnGuard(cfg.ConnAuthTimeout, tm),
		translog: tl,
		cfg:      cfg,
		st:       st,
		log:      log,
		tlog:     telemetry.Log{L: log, Backend: label},
		metrics:  m,
		stats:    stats,
		hot:      hot,
		est:      est,
		reg:      reg,
	}
	s.maxWait.Store(int64(MaxWait))
	s.plim = newPrincipalLimits(cfg, s.lim, opts.Auth, log)
	if err := cfg.checkAnonymousAdmin(opts.Auth.Policy() != nil, log); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if s.grpcTLS, s.metricsTLS, s.httpTLS, err = cfg.tlsSetup(log); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if s.tp, err = newTracerProvider(cfg, opts.TraceExporter); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.sess = s.newTable() // its silence loop runs until Shutdown closes it
	gopts := s.grpcOptions(opts.Auth)
	s.grpc = grpc.NewServer(append(s.grpcCreds(), gopts...)...)
	lockdv1.RegisterLockServiceServer(s.grpc, service{Server: s})
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(lockdv1.LockService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	s.wg.Add(1)
	if cfg.HTTPListen != "" {
		s.http = s.newHTTPAPI(gopts)
		s.wg.Add(1)
		go func() { // exits when the in-process server stops (Shutdown)
			defer s.wg.Done()
			_ = s.http.inproc.Serve(s.http.pipes)
		}()
	}
	go s.lostLoop() // exits when s.ctx ends
	return s, nil
}

// grpcOptions are the options of the gRPC server but its transport
// credentials: the public server's and the HTTP/JSON API's in-process one
// (http.go) are the same server but for them.
func (s *Server) grpcOptions(az *auth.Authorizer) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxReadMsgSize), // MaxRecvMsgSize is the codec's (badinput.go)
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.ForceServerCodecV2(newRequestCodec(&s.bad)),
		grpc.ChainUnaryInterceptor(s.unaryBadUTF8, s.authUnary(az), s.unaryLimits, s.principalUnary(az)),
		grpc.ChainStreamInterceptor(s.streamBadUTF8, s.authStream(az), s.streamLimits, s.principalStreams(az)),
		grpc.StatsHandler(principalConns{s.plim}), // per principal, before s.lim (principal_conns.go)
		grpc.StatsHandler(s.lim),                  // counts connections (limits.go)
		grpc.StatsHandler(s.guard),                // finds a call's connection (idle.go)
		// Find dead client connections (a waiting Acquire of a client
		// that vanished then ends, and its waiter leaves the queue), and
		// close connections with no call in progress (C5 #ct5-idle).
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: s.cfg.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if o := s.tracingOption(); o != nil { // only when tracing is on (C2 #ct2-tracing)
		opts = append(opts, o)
	}
	return opts
}

// Serve accepts gRPC connections on lis until Shutdown; it returns nil after
// Shutdown and the listener's error otherwise.
func (s *Server) Serve(lis net.Listener) error {
	err := s.grpc.Serve(s.guard.listener(lis, telemetry.ListenerGRPC))
	if errors.Is(err, grpc.ErrServerStopped) || s.ctx.Err() != nil {
		return nil
	}
	return err
}

// MetricsHandler serves "/metrics" (lockd's own registry only: the C4
// metrics) and "/healthz" (200 while serving, 503 once Shutdown began).
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})) // C4 metrics only: no handler self-metrics
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.ctx.Err() != nil {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Shutdown stops the server (see the package doc): it stops accepting
// connections, closes every session first if Config.CloseSessionsOnShutdown
// (otherwise sessions are left to expire), ends waiting acquires and
// streams, waits for in-flight RPCs and every goroutine of the server. When
// ctx ends first, remaining RPCs are cut off and ctx's error is returned.
// Calling it again returns the first call's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown(ctx) })
	return s.shutdownErr
}

func (s *Server) shutdown(ctx context.Context) error {
	s.health.Shutdown()
	defer s.guard.close()
	var errs []error
	if s.cfg.CloseSessionsOnShutdown {
		errs = append(errs, s.closeAll(ctx))
	} else if s.cfg.DrainTimeout > 0 {
		s.drain(ctx) // drain.go: clients move, no session ends
	}
	stopped := make(chan struct{})
	go func() { // exits when GracefulStop returns (bounded: Stop below)
		s.grpc.GracefulStop()
		close(stopped)
	}()
	var httpDone chan error
	if s.http != nil {
		httpDone = make(chan error, 1)
		go func() { // exits when the HTTP API has stopped (bounded by ctx)
			httpDone <- s.http.shutdown(ctx)
		}()
	}
	// Long-running handlers (waits, KeepAlive and Watch streams) end now,
	// so the graceful stop only waits for short RPCs.
	s.cancel()
	s.sess.Close() // stops the silence loop and waits for it
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		<-stopped
		errs = append(errs, fmt.Errorf("server: shutdown: %w", ctx.Err()))
	}
	if httpDone != nil {
		if err := <-httpDone; err != nil {
			errs = append(errs, fmt.Errorf("server: shutdown of the HTTP/JSON API: %w", err))
		}
	}
	s.wg.Wait()
	s.shutdownTracing(ctx) // after every span ended
	return errors.Join(errs...)
}

// Helpers for constant-message operational logs.

func attrError(err error) slog.Attr { return slog.String("error", err.Error()) }

func attrDuration(k string, d time.Duration) slog.Attr { return slog.Int64(k+"_ms", d.Milliseconds()) }
