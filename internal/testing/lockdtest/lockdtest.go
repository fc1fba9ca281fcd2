package lockdtest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
)

// Backends are the backends every server test runs over.
var Backends = []string{backend.Etcd, backend.PG}

// Test timing: short enough for fast tests, long enough for a loaded
// two-core machine running -race.
const (
	TTL          = 3 * time.Second
	SafetyMargin = 500 * time.Millisecond
)

// Main runs the tests, then stops the shared embedded etcd and PostgreSQL
// servers, then fails the run if goroutines leaked (goleak; opts are passed
// on). It does not return.
func Main(m *testing.M, opts ...goleak.Option) {
	testkit.Main(pgtest.M{M: m}, []func(){stopExampleServer, etcdtest.Stop}, opts...)
}

// Config returns a valid server.Config for tests: TTL and SafetyMargin
// above, listen addresses on loopback, no drain at shutdown.
func Config() server.Config {
	cfg := server.DefaultConfig()
	cfg.SessionTTL = TTL
	cfg.SafetyMargin = SafetyMargin
	cfg.Listen = "127.0.0.1:0"
	cfg.MetricsListen = "127.0.0.1:0"
	// No drain at Stop (C2 #ct2-drain): a test's server stops at once, as
	// before; the drain tests set it.
	cfg.DrainTimeout = 0
	return cfg
}

// Options configure Start.
type Options struct {
	// Config is the server's configuration; nil uses Config().
	Config *server.Config
	// Logger receives the server's (and the store's) logs; nil discards.
	Logger *slog.Logger
	// ClientOptions configure the connected Client.
	ClientOptions []client.Option
	// NoClient skips creating the connected Client.
	NoClient bool
	// Wrap, if set, wraps the store before the server gets it (fault
	// injection, see Faulty).
	Wrap func(store.LockStore) store.LockStore
	// Auth is the server's access control (server.Options.Auth); nil
	// allows every call.
	Auth *auth.Authorizer
	// TraceExporter receives the server's spans when Config turns
	// tracing on (server.Options.TraceExporter).
	TraceExporter sdktrace.SpanExporter
}

// Server is a running lockd server.
type Server struct {
	*server.Server
	// Addr is the gRPC address (host:port).
	Addr string
	// Store is the store the server runs over (after Options.Wrap).
	Store store.LockStore
	// Registry holds the server's metrics.
	Registry *prometheus.Registry
	// HTTPAddr is the HTTP/JSON API's address (host:port; over TLS when
	// the config sets lock.server.tls.*), "" when Config.HTTPListen is
	// empty (the API is off).
	HTTPAddr string
	// Client is connected to the server (nil with Options.NoClient).
	Client *client.Client

	served   chan error // the results of Serve and ServeHTTPAPI
	serving  int        // how many of them run
	stopOnce sync.Once
	stopErr  error
	lis      *trackingListener
}

// StartBackend starts a server over a fresh, isolated store on kind
// (backend.Etcd: a new key prefix on the shared embedded etcd; backend.PG:
// a new database on the shared PostgreSQL). The store and the server share
// one telemetry.Metrics on the server's registry.
func StartBackend(t testing.TB, kind string, opts Options) *Server {
	t.Helper()
	return StartOn(t, NewNamespace(t, kind), opts)
}

// StartOn starts a server over a new store instance on ns: several servers
// on one namespace stand in for lockd replicas sharing a backend.
func StartOn(t testing.TB, ns *Namespace, opts Options) *Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := telemetry.NewMetrics(reg, ns.backend)
	if err != nil {
		t.Fatalf("lockdtest: metrics: %v", err)
	}
	st := ns.OpenStore(t, StoreOptions{Logger: opts.Logger, Metrics: m})
	return start(t, st, ns.backend, reg, m, opts)
}

// Start starts a server over st (closed by the caller).
func Start(t testing.TB, st store.LockStore, opts Options) *Server {
	t.Helper()
	return start(t, st, "", nil, nil, opts)
}

// start starts a server over st; label is the C4 backend label ("" for the
// server's default).
func start(t testing.TB, st store.LockStore, label string, reg *prometheus.Registry, m *telemetry.Metrics, opts Options) *Server {
	t.Helper()
	cfg := Config()
	if opts.Config != nil {
		cfg = *opts.Config
	}
	if opts.Wrap != nil {
		st = opts.Wrap(st)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	srv, err := server.New(cfg, st, server.Options{Logger: opts.Logger, Registry: reg, Metrics: m, BackendLabel: label, Auth: opts.Auth, TraceExporter: opts.TraceExporter})
	if err != nil {
		t.Fatalf("lockdtest: server.New: %v", err)
	}
	// cfg.Listen: 127.0.0.1:0 unless the test asks for an address (a
	// replica restarted on the address it had).
	inner, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		t.Fatalf("lockdtest: listen: %v", err)
	}
	lis := &trackingListener{Listener: inner, conns: map[net.Conn]bool{}}
	s := &Server{Server: srv, Addr: lis.Addr().String(), Store: st, Registry: reg, served: make(chan error, 2), lis: lis}
	go func() { s.served <- srv.Serve(lis) }() // exits after Shutdown (Stop)
	s.serving = 1
	if cfg.HTTPListen != "" {
		// cfg.HTTPListen: 127.0.0.1:0 unless the test asks for an
		// address (a server restarted under a browser page).
		hlis, err := net.Listen("tcp", cfg.HTTPListen)
		if err != nil {
			_ = srv.Shutdown(context.Background())
			t.Fatalf("lockdtest: listen (HTTP): %v", err)
		}
		s.HTTPAddr = hlis.Addr().String()
		s.serving++
		go func() { s.served <- srv.ServeHTTPAPI(hlis) }() // exits after Shutdown (Stop)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("lockdtest: stop server: %v", err)
		}
	})
	if !opts.NoClient {
		s.Client = s.NewClient(t, opts.ClientOptions...)
	}
	return s
}

// NewClient returns another client of the server, closed when the test
// ends.
func (s *Server) NewClient(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithBackoff(10*time.Millisecond, 200*time.Millisecond)}, opts...)
	c, err := client.New(s.Addr, opts...)
	if err != nil {
		t.Fatalf("lockdtest: client.New(%s): %v", s.Addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop shuts the server down (sessions are left to expire) and waits until
// Serve (and ServeHTTPAPI) returned. It is idempotent; the test's cleanup calls it too.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s.stopErr = s.Shutdown(ctx)
		for range s.serving {
			if err := <-s.served; err != nil && s.stopErr == nil && !s.lis.wasKilled() { // Kill closed the listener under Serve
				s.stopErr = fmt.Errorf("serve: %w", err)
			}
		}
	})
	return s.stopErr
}

// Kill stands in for SIGKILL of the server process: every client connection
// is reset at once (TCP RST) and the listener closed, so clients see the
// connection break, never a graceful GOAWAY or a status; then the server is
// stopped without closing any session (their locks stay until the backend
// expires them, or another replica keeps them). Unlike a real kill, the
// store's calls in flight end through their cancellation (e.g. a waiting
// Acquire without store.KeepPlace leaves its queue). Idempotent with Stop.
func (s *Server) Kill() error {
	s.lis.reset()
	return s.Stop()
}

// trackingListener remembers the connections it accepted, so that Kill can
// reset them.
type trackingListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]bool
	killed bool
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.killed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns[c] = true
	return &trackedConn{Conn: c, l: l}, nil
}

func (l *trackingListener) wasKilled() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.killed
}

// reset closes the listener and resets every accepted connection.
func (l *trackingListener) reset() {
	l.mu.Lock()
	l.killed = true
	conns := l.conns
	l.conns = map[net.Conn]bool{}
	l.mu.Unlock()
	_ = l.Listener.Close()
	for c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with RST, as the kernel does for a killed process
		}
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	l *trackingListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c.Conn)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
