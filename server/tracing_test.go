package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// ctxSpy is a store that records whether an Acquire's context carried a
// valid span context: what the server passed down after reading (or not
// reading) the caller's trace context.
type ctxSpy struct {
	store.LockStore
	traced, untraced atomic.Int32
}

func (s *ctxSpy) Acquire(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, error) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		s.traced.Add(1)
	} else {
		s.untraced.Add(1)
	}
	return s.LockStore.Acquire(ctx, id, key, opts...)
}

// tracedServer starts a server with the HTTP/JSON API, tracing on or off,
// its spans in the returned exporter, its store behind a ctxSpy.
func tracedServer(t *testing.T, backend string, on bool) (*lockdtest.Server, *tracetest.InMemoryExporter, *ctxSpy) {
	t.Helper()
	cfg := lockdtest.Config()
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.TracingEnabled = on
	exp := tracetest.NewInMemoryExporter()
	spy := &ctxSpy{}
	srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg, TraceExporter: exp,
		Wrap: func(st store.LockStore) store.LockStore { spy.LockStore = st; return spy }})
	return srv, exp, spy
}

// holdThenRelease holds key with an untraced session, runs wait (an
// Acquire of key that must wait) once the key is held, releases the key once
// the waiter is queued, and returns when wait returned.
func holdThenRelease(t *testing.T, srv *lockdtest.Server, key string, wait func(context.Context) error) {
	t.Helper()
	holdThenReleaseWith(t, srv, key, [][]client.AcquireOption{nil}, wait)
}

// holdThenReleaseWith is holdThenRelease with a holder per element of
// holders, each an untraced session of its own acquiring key with those
// options (several fill a semaphore); all are released once the waiter is
// queued.
func holdThenReleaseWith(t *testing.T, srv *lockdtest.Server, key string, holders [][]client.AcquireOption, wait func(context.Context) error) {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	var locks []*client.Lock
	for _, opts := range holders {
		holder, err := srv.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		defer holder.Close(context.Background())
		l, err := holder.Acquire(ctx, key, opts...)
		if err != nil {
			t.Fatalf("holder Acquire: %v", err)
		}
		locks = append(locks, l)
	}
	done := make(chan error, 1)
	go func() { done <- wait(ctx) }() // ends: the key is released below, ctx bounds it
	testkit.Eventually(t, 30*time.Second, "the waiter queued", func() bool {
		info, err := srv.Client.Inspect(ctx, key)
		return err == nil && len(info.Waiters) == 1
	})
	for _, l := range locks {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("holder Release: %v", err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiting Acquire: %v", err)
	}
}

// spanNamed returns the spans named name of trace tid.
func spansNamed(spans tracetest.SpanStubs, tid trace.TraceID, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() == tid && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// checkTrace asserts that trace tid holds a server Acquire span whose
// parent is one of parents, a lockd.wait span under it, and a backend commit
// span under either; it waits for the server's spans (they end after the
// reply).
//
// A semaphore slot's or read/write side's trace (multi) has no commit span:
// its grant is no group commit (C4 #ct4-traces).
func checkTrace(t *testing.T, exp *tracetest.InMemoryExporter, tid trace.TraceID, parents map[trace.SpanID]bool, multi ...bool) {
	t.Helper()
	var why string
	err := testkit.Poll(10*time.Second, func() bool {
		spans := exp.GetSpans()
		var acq tracetest.SpanStub
		for _, s := range spansNamed(spans, tid, "lockd.v1.LockService/Acquire") {
			if s.SpanKind == trace.SpanKindServer && parents[s.Parent.SpanID()] {
				acq = s
			}
		}
		if !acq.SpanContext.IsValid() {
			why = fmt.Sprintf("no server Acquire span in trace %s under the caller's span (%d spans recorded)", tid, len(spans))
			return false
		}
		under := map[trace.SpanID]bool{acq.SpanContext.SpanID(): true}
		waits := spansNamed(spans, tid, "lockd.wait")
		if len(waits) != 1 || waits[0].Parent.SpanID() != acq.SpanContext.SpanID() {
			why = fmt.Sprintf("want one lockd.wait span under the server span, have %d", len(waits))
			return false
		}
		under[waits[0].SpanContext.SpanID()] = true
		if len(multi) > 0 && multi[0] {
			return true
		}
		for _, c := range spansNamed(spans, tid, "lockd.backend.commit") {
			if under[c.Parent.SpanID()] {
				for _, a := range c.Attributes {
					if a.Key == "lockd.batch.size" && a.Value.AsInt64() >= 1 {
						return true
					}
				}
			}
		}
		why = "no lockd.backend.commit span with lockd.batch.size under the server or wait span"
		return false
	})
	if err != nil {
		t.Fatal(why)
	}
}

// callerAcquire runs, under a caller's span of tp, an Acquire of key from
// an SDK client traced by tp that waits for key (holdThenRelease) and
// releases it, and returns the caller's span context.
func callerAcquire(t *testing.T, srv *lockdtest.Server, tp trace.TracerProvider, key string) trace.SpanContext {
	t.Helper()
	return callerAcquireWith(t, srv, tp, key, [][]client.AcquireOption{nil})
}

// callerAcquireWith is callerAcquire behind holders (holdThenReleaseWith),
// the caller's Acquire with opts.
func callerAcquireWith(t *testing.T, srv *lockdtest.Server, tp trace.TracerProvider, key string, holders [][]client.AcquireOption, opts ...client.AcquireOption) trace.SpanContext {
	t.Helper()
	traced := srv.NewClient(t, client.WithTracerProvider(tp))
	var root trace.SpanContext
	holdThenReleaseWith(t, srv, key, holders, func(ctx context.Context) error {
		ctx, span := tp.Tracer("test").Start(ctx, "caller")
		defer span.End()
		root = span.SpanContext()
		sess, err := traced.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			return err
		}
		defer sess.Close(context.Background())
		l, err := sess.Acquire(ctx, key, opts...)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
	return root
}

// TestTracing: one waiting Acquire is one trace — the SDK's client span,
// the server span, the wait and the backend commit — from the Go SDK and
// over HTTP with a traceparent header; a semaphore slot's and a read/write
// side's wait have their lockd.wait span too; with tracing off nothing is
// recorded and the caller's trace context is not acted on (C4
// #ct4-traces, C2 #ct2-tracing). Both backends.
func TestTracing(t *testing.T) {
	for _, backend := range lockdtest.Backends {
		t.Run(backend, func(t *testing.T) {
			sdkExp := tracetest.NewInMemoryExporter()
			sdkTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(sdkExp))
			t.Cleanup(func() { _ = sdkTP.Shutdown(context.Background()) })
			traceparent := func(tid trace.TraceID, sid trace.SpanID) string {
				return fmt.Sprintf("00-%s-%s-01", tid, sid)
			}
			tid := trace.TraceID{0x4c, 0x6f, 0x63, 0x6b, 0x64, 1}
			sid := trace.SpanID{0x68, 0x74, 0x74, 0x70, 1}

			t.Run("on", func(t *testing.T) {
				srv, exp, spy := tracedServer(t, backend, true)
				root := callerAcquire(t, srv, sdkTP, "trace/sdk")
				parents := map[trace.SpanID]bool{}
				for _, s := range spansNamed(sdkExp.GetSpans(), root.TraceID(), "lockd.v1.LockService/Acquire") {
					if s.SpanKind == trace.SpanKindClient && s.Parent.SpanID() == root.SpanID() {
						parents[s.SpanContext.SpanID()] = true
					}
				}
				if len(parents) == 0 {
					t.Fatalf("the SDK recorded no client Acquire span under the caller's span")
				}
				checkTrace(t, exp, root.TraceID(), parents)

				// A semaphore slot's wait (two holders of a semaphore of 2)
				// and a read/write side's (a reader behind a writer) are
				// traced too (C4 #ct4-traces).
				for _, m := range []struct {
					key     string
					holders [][]client.AcquireOption
					opts    []client.AcquireOption
				}{
					{"trace/sem", [][]client.AcquireOption{{client.WithLimit(2)}, {client.WithLimit(2)}}, []client.AcquireOption{client.WithLimit(2)}},
					{"trace/rw", [][]client.AcquireOption{{client.Exclusive()}}, []client.AcquireOption{client.Shared()}},
				} {
					root := callerAcquireWith(t, srv, sdkTP, m.key, m.holders, m.opts...)
					parents := map[trace.SpanID]bool{}
					for _, s := range spansNamed(sdkExp.GetSpans(), root.TraceID(), "lockd.v1.LockService/Acquire") {
						if s.SpanKind == trace.SpanKindClient && s.Parent.SpanID() == root.SpanID() {
							parents[s.SpanContext.SpanID()] = true
						}
					}
					checkTrace(t, exp, root.TraceID(), parents, true)
				}

				// The same over HTTP, the caller's span given as a
				// traceparent header.
				c := newJClient(t, "http://"+srv.HTTPAddr, nil)
				s := c.open(longTTL)
				holdThenRelease(t, srv, "trace/http", func(context.Context) error {
					st, out := c.do("POST", "/v1/locks/trace/http:acquire", obj{"session_id": s.id, "session_secret": s.secret, "wait": true},
						"traceparent", traceparent(tid, sid))
					if st != http.StatusOK || out["granted"] != true {
						return fmt.Errorf("HTTP acquire = %d %v", st, out)
					}
					return nil
				})
				checkTrace(t, exp, tid, map[trace.SpanID]bool{sid: true})
				// lockd starts a trace of its own for the holders' untraced
				// calls (sample ratio 1): every store call is under a span.
				if n := spy.untraced.Load(); n != 0 || spy.traced.Load() < 4 {
					t.Errorf("tracing on: %d store Acquire calls without a span context (%d with); want none",
						n, spy.traced.Load())
				}
			})

			t.Run("off", func(t *testing.T) {
				srv, exp, spy := tracedServer(t, backend, false)
				root := callerAcquire(t, srv, sdkTP, "trace/off")
				if len(spansNamed(sdkExp.GetSpans(), root.TraceID(), "lockd.v1.LockService/Acquire")) == 0 {
					t.Fatalf("the SDK sent no traced Acquire: the check below would prove nothing")
				}
				c := newJClient(t, "http://"+srv.HTTPAddr, nil)
				s := c.open(longTTL)
				holdThenRelease(t, srv, "trace/off-http", func(context.Context) error {
					st, out := c.do("POST", "/v1/locks/trace/off-http:acquire", obj{"session_id": s.id, "session_secret": s.secret, "wait": true},
						"traceparent", traceparent(tid, sid))
					if st != http.StatusOK || out["granted"] != true {
						return fmt.Errorf("HTTP acquire = %d %v", st, out)
					}
					return nil
				})
				if err := srv.Stop(); err != nil { // every span a call started has ended
					t.Fatalf("Stop: %v", err)
				}
				if n := len(exp.GetSpans()); n != 0 {
					t.Errorf("tracing off recorded %d spans; want none", n)
				}
				if n := spy.traced.Load(); n != 0 || spy.untraced.Load() < 4 {
					t.Errorf("tracing off: %d store Acquire calls carried a span context (%d did not); want none",
						n, spy.untraced.Load())
				}
			})
		})
	}
}

// BenchmarkTracingAcquireRelease measures the cost of tracing on the
// Acquire/Release hot path through the Go SDK (docs/backends.md "Tracing
// on vs off"): off (the default), on at the server only (every call a
// trace lockd starts, sample ratio 1), and on at both ends (the SDK's
// client spans and traceparent too). The server's spans go to a
// discarding exporter, synchronously: the cost measured is recording, not
// the OTLP export.
func BenchmarkTracingAcquireRelease(b *testing.B) {
	for _, backend := range lockdtest.Backends {
		for _, mode := range []string{"off", "server", "sdk+server"} {
			b.Run(backend+"/"+mode, func(b *testing.B) {
				cfg := lockdtest.Config()
				cfg.TracingEnabled = mode != "off"
				srv := lockdtest.StartBackend(b, backend, lockdtest.Options{Config: &cfg, TraceExporter: tracetest.NewNoopExporter()})
				c := srv.Client
				if mode == "sdk+server" {
					tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
					b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
					c = srv.NewClient(b, client.WithTracerProvider(tp))
				}
				ctx := testkit.Context(b, 10*time.Minute)
				sess, err := c.NewSession(ctx)
				if err != nil {
					b.Fatalf("NewSession: %v", err)
				}
				defer sess.Close(context.Background())
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					l, err := sess.Acquire(ctx, "bench/trace")
					if err != nil {
						b.Fatalf("Acquire: %v", err)
					}
					if err := l.Release(ctx); err != nil {
						b.Fatalf("Release: %v", err)
					}
				}
			})
		}
	}
}
