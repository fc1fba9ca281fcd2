package server_test

import (
	"context"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/server"
)

// collector keeps the span names and service names of what it received.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []string // "service.name span name"
}

func (c *collector) add(req *coltracepb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		var svc string
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				svc = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, svc+" "+s.GetName())
			}
		}
	}
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) has(span string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.spans {
		if s == span {
			return true
		}
	}
	return false
}

// acquireOnce opens a session on srv's client, takes otlp/k and closes
// the session.
func acquireOnce(t *testing.T, srv *lockdtest.Server) {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	sess, err := srv.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	if _, err := sess.Acquire(ctx, "otlp/k"); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	_ = sess.Close(ctx)
}

// otlpAcquire runs one Acquire through a server whose tracing exports by
// OTLP as cfg says, stops it (flushing the batch) and checks the collector
// got the server's Acquire span from service lockd.
func otlpAcquire(t *testing.T, cfg server.Config, col *collector) {
	t.Helper()
	srv := lockdtest.StartBackend(t, "etcd", lockdtest.Options{Config: &cfg})
	acquireOnce(t, srv)
	if err := srv.Stop(); err != nil { // the tracer provider's shutdown flushes
		t.Fatalf("Stop: %v", err)
	}
	if !col.has("lockd lockd.v1.LockService/Acquire") {
		t.Fatalf("the collector got %v; want the server's Acquire span of service lockd", col.spans)
	}
}

// TestTracingOTLP exports through the real OTLP exporters the C5 keys
// configure (C5 #ct5-tracing): gRPC in plaintext, HTTP over TLS verified
// with otlp-ca-file. The exporter is the server's, not a backend's: one
// backend (etcd) suffices; TestTracing covers both backends' spans.
func TestTracingOTLP(t *testing.T) {
	t.Run("grpc", func(t *testing.T) {
		col := &collector{}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(gs, col)
		go func() { _ = gs.Serve(lis) }() // ends at Stop below
		defer gs.Stop()
		cfg := lockdtest.Config()
		cfg.TracingEnabled, cfg.TracingOTLPInsecure, cfg.TracingOTLPEndpoint = true, true, lis.Addr().String()
		otlpAcquire(t, cfg, col)
	})
	t.Run("unreachable", func(t *testing.T) {
		// A collector that is not there fails no call, and the stop
		// neither fails nor waits more than the flush bound (5 s).
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		_ = lis.Close()
		cfg := lockdtest.Config()
		cfg.TracingEnabled, cfg.TracingOTLPInsecure, cfg.TracingOTLPEndpoint = true, true, addr
		srv := lockdtest.StartBackend(t, "etcd", lockdtest.Options{Config: &cfg})
		acquireOnce(t, srv)
		start := time.Now()
		if err := srv.Stop(); err != nil {
			t.Fatalf("Stop with an unreachable collector: %v; want nil", err)
		}
		t.Logf("Stop took %v", time.Since(start))
		if d := time.Since(start); d > 8*time.Second { // the flush bound (5 s), with room for a loaded machine; the exporter alone would take its 10 s timeout
			t.Fatalf("Stop took %v with an unreachable collector; the flush is bounded by 5 s", d)
		}
	})
	t.Run("http-tls", func(t *testing.T) {
		col := &collector{}
		hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			req := &coltracepb.ExportTraceServiceRequest{}
			if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
				http.Error(w, "bad export", http.StatusBadRequest)
				return
			}
			col.add(req)
			w.Header().Set("Content-Type", "application/x-protobuf")
			out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
			_, _ = w.Write(out)
		}))
		defer hs.Close()
		ca := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := lockdtest.Config()
		cfg.TracingEnabled, cfg.TracingOTLPProtocol, cfg.TracingOTLPCAFile = true, server.TracingHTTP, ca
		cfg.TracingOTLPEndpoint = strings.TrimPrefix(hs.URL, "https://")
		otlpAcquire(t, cfg, col)
	})
}

// TestTracingConfig: the tracing keys' refusals name the key (C5
// #ct5-tracing); an unreadable CA file is refused only with tracing on.
func TestTracingConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*server.Config)
		key  string
	}{
		{"ratio above 1", func(c *server.Config) { c.TracingSampleRatio = 1.5 }, "lock.server.tracing.sample-ratio"},
		{"ratio below 0", func(c *server.Config) { c.TracingSampleRatio = -0.1 }, "lock.server.tracing.sample-ratio"},
		{"protocol", func(c *server.Config) { c.TracingOTLPProtocol = "udp" }, "lock.server.tracing.otlp-protocol"},
		{"CA with insecure", func(c *server.Config) { c.TracingOTLPInsecure, c.TracingOTLPCAFile = true, "/ca.pem" },
			"lock.server.tracing.otlp-ca-file"},
	} {
		cfg := server.DefaultConfig()
		tc.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: Validate = %v; want an error naming %s", tc.name, err, tc.key)
		}
	}
	if err := server.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg := lockdtest.Config()
	cfg.TracingOTLPCAFile = filepath.Join(t.TempDir(), "missing.pem")
	srv := lockdtest.StartBackend(t, "etcd", lockdtest.Options{Config: &cfg, NoClient: true}) // off: not read
	cfg.TracingEnabled = true
	if _, err := server.New(cfg, srv.Store, server.Options{}); err == nil || !strings.Contains(err.Error(), "lock.server.tracing.otlp-ca-file") {
		t.Errorf("New with an unreadable CA file = %v; want an error naming lock.server.tracing.otlp-ca-file", err)
	}
}
