package client

import (
	"context"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// WithTracerProvider opts the client into OpenTelemetry tracing (C4
// #ct4-traces): every unary RPC it sends (not the KeepAlive and Watch
// streams) is a client span of tp, the child of the span in the call's
// context, and carries W3C trace context (traceparent, tracestate) to the
// server, which continues the trace when its tracing is on (C2
// #ct2-tracing). The SDK uses only the OpenTelemetry API (otel/trace,
// otel/propagation), never the SDK: tp is the application's. Without this
// option the client records nothing and sends no trace context.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp }
}

// tracerName is the instrumentation scope of the SDK's spans.
const tracerName = "lock.dev/lockd/client"

// tracingInterceptor starts the client span of one unary RPC and injects
// its context into the call's metadata.
func tracingInterceptor(tp trace.TracerProvider) grpc.UnaryClientInterceptor {
	tracer := tp.Tracer(tracerName)
	prop := propagation.TraceContext{} // its own, never the process-wide one
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		name := strings.TrimPrefix(method, "/")
		ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("rpc.system.name", "grpc"), attribute.String("rpc.method", name)))
		defer span.End()
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		prop.Inject(ctx, metadataCarrier(md))
		err := invoker(metadata.NewOutgoingContext(ctx, md), method, req, reply, cc, opts...)
		code := canonicalCode(status.Code(err))
		span.SetAttributes(attribute.String("rpc.response.status_code", code))
		if err != nil {
			span.SetStatus(codes.Error, code)
		}
		return err
	}
}

// canonicalNames are the gRPC codes' canonical names (C4 #ct4-traces, as
// the server's otelgrpc spans and the other SDKs write them), by code.
var canonicalNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

// canonicalCode is c's canonical name (grpc-go's Code.String is
// "DeadlineExceeded", not the canonical "DEADLINE_EXCEEDED").
func canonicalCode(c grpccodes.Code) string {
	if int(c) < len(canonicalNames) {
		return canonicalNames[c]
	}
	return "CODE(" + strconv.Itoa(int(c)) + ")"
}

// metadataCarrier lets the propagator write gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
