package client

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
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
		code := status.Code(err)
		span.SetAttributes(attribute.String("rpc.response.status_code", code.String()))
		if err != nil {
			span.SetStatus(codes.Error, code.String())
		}
		return err
	}
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
