package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/textproto"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// OTLP protocols of lock.server.tracing.otlp-protocol (C5 #ct5-tracing).
const (
	TracingGRPC = "grpc"
	TracingHTTP = "http"
)

// validateTracing checks the lock.server.tracing.* keys (C5 #ct5-tracing);
// the CA file is read only when tracing is on (newTracerProvider).
func (c Config) validateTracing(bad func(key, format string, args ...any)) {
	if p := c.TracingOTLPProtocol; p != TracingGRPC && p != TracingHTTP {
		bad("lock.server.tracing.otlp-protocol", "%q must be %q or %q", p, TracingGRPC, TracingHTTP)
	}
	if r := c.TracingSampleRatio; !(r >= 0 && r <= 1) {
		bad("lock.server.tracing.sample-ratio", "%v must be in [0, 1]", r)
	}
	if c.TracingOTLPInsecure && c.TracingOTLPCAFile != "" {
		bad("lock.server.tracing.otlp-ca-file", "must not be set with lock.server.tracing.otlp-insecure")
	}
}

// newTracerProvider builds the server's tracer provider when tracing is on
// (nil otherwise): spans go to exp when it is not nil (tests: synchronously),
// else to the OTLP exporter of the config, batched. The server owns it and
// shuts it down at the end of Shutdown.
func newTracerProvider(c Config, exp sdktrace.SpanExporter) (*sdktrace.TracerProvider, error) {
	if !c.TracingEnabled {
		return nil, nil
	}
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.TracingSampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "lockd"))),
	}
	if exp != nil {
		return sdktrace.NewTracerProvider(append(opts, sdktrace.WithSyncer(exp))...), nil
	}
	var tlsCfg *tls.Config
	if !c.TracingOTLPInsecure {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12} // nil RootCAs: the system roots
		if c.TracingOTLPCAFile != "" {
			pem, err := os.ReadFile(c.TracingOTLPCAFile)
			if err != nil {
				return nil, fmt.Errorf("lock.server.tracing.otlp-ca-file: %w", err)
			}
			tlsCfg.RootCAs = x509.NewCertPool()
			if !tlsCfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, errors.New("lock.server.tracing.otlp-ca-file: no PEM certificate in " + c.TracingOTLPCAFile)
			}
		}
	}
	var (
		e   sdktrace.SpanExporter
		err error
	)
	// New does not connect: an unreachable collector fails no start.
	if c.TracingOTLPProtocol == TracingHTTP {
		o := []otlptracehttp.Option{otlptracehttp.WithTimeout(tracingFlushTimeout)}
		if c.TracingOTLPEndpoint != "" {
			o = append(o, otlptracehttp.WithEndpoint(c.TracingOTLPEndpoint))
		}
		if tlsCfg == nil {
			o = append(o, otlptracehttp.WithInsecure())
		} else {
			o = append(o, otlptracehttp.WithTLSClientConfig(tlsCfg))
		}
		e, err = otlptracehttp.New(context.Background(), o...)
	} else {
		o := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(tracingFlushTimeout)}
		if c.TracingOTLPEndpoint != "" {
			o = append(o, otlptracegrpc.WithEndpoint(c.TracingOTLPEndpoint))
		}
		if tlsCfg == nil {
			o = append(o, otlptracegrpc.WithInsecure())
		} else {
			o = append(o, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tlsCfg)))
		}
		e, err = otlptracegrpc.New(context.Background(), o...)
	}
	if err != nil {
		return nil, fmt.Errorf("lock.server.tracing: OTLP exporter: %w", err)
	}
	return sdktrace.NewTracerProvider(append(opts, sdktrace.WithBatcher(e))...), nil
}

// tracingOption is the gRPC stats handler that starts a server span per
// traced RPC and reads W3C trace context from the call's metadata (C4
// #ct4-traces), or nil when tracing is off: then nothing reads it.
func (s *Server) tracingOption() grpc.ServerOption {
	if s.tp == nil {
		return nil
	}
	return grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(s.tp),
		otelgrpc.WithPropagators(propagation.TraceContext{}),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()), // no metrics beside C4's
		otelgrpc.WithFilter(tracedRPC),
	))
}

// tracedRPC: the unary LockService RPCs; not the KeepAlive and Watch
// streams (they live as long as a session or a watch), health or
// reflection.
func tracedRPC(info *stats.RPCTagInfo) bool {
	m := info.FullMethodName
	return lockdMethod(m) && m != lockdv1.LockService_KeepAlive_FullMethodName && m != lockdv1.LockService_Watch_FullMethodName
}

// traceHeaders is the HTTP/JSON API's header matcher when tracing is on:
// traceparent and tracestate become the in-process call's metadata (C2
// #ct2-tracing); every other header stays out, as with tracing off.
func traceHeaders(h string) (string, bool) {
	switch textproto.CanonicalMIMEHeaderKey(h) {
	case "Traceparent", "Tracestate":
		return strings.ToLower(h), true
	}
	return "", false
}

// tracingFlushTimeout bounds every OTLP export, retries included, and so
// the flush at shutdown (C5 #ct5-tracing).
const tracingFlushTimeout = 5 * time.Second

// shutdownTracing flushes and stops the tracer provider (end of Shutdown),
// within about tracingFlushTimeout; a failure (an unreachable collector)
// goes to OpenTelemetry's error handler (lockd serve: tracing_error), not
// to Shutdown's error.
func (s *Server) shutdownTracing(ctx context.Context) {
	if s.tp == nil {
		return
	}
	// Not cut short by ctx: the export under way ends by its own timeout
	// (tracingFlushTimeout), and Shutdown returns only once it has, so no
	// exporter goroutine outlives the server.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout+time.Second)
	defer cancel()
	if err := s.tp.Shutdown(ctx); err != nil {
		otel.Handle(fmt.Errorf("tracing shutdown: %w", err))
	}
}
