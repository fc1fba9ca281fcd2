package client

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTraceStatusCodeNames: a client span's rpc.response.status_code, and
// its error status's description, is the gRPC code's canonical name (C4
// #ct4-traces: OK, DEADLINE_EXCEEDED, ...), as the server span's
// (otelgrpc) and the Python and TypeScript SDKs' are. Before, the Go SDK
// wrote grpc-go's Code.String() ("DeadlineExceeded", "Canceled").
func TestTraceStatusCodeNames(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ic := tracingInterceptor(tp)
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		exp.Reset()
		err := ic(context.Background(), "/lockd.v1.LockService/Inspect", nil, nil, nil,
			func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				if code == codes.OK {
					return nil
				}
				return status.Error(code, "x")
			})
		if (err == nil) != (code == codes.OK) {
			t.Fatalf("%v: interceptor returned %v", code, err)
		}
		spans := exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%v: %d spans, want 1", code, len(spans))
		}
		want := canonicalCode(code)
		var got attribute.Value
		for _, a := range spans[0].Attributes {
			if a.Key == "rpc.response.status_code" {
				got = a.Value
			}
		}
		if got.AsString() != want {
			t.Errorf("%v: rpc.response.status_code %q, want %q", code, got.AsString(), want)
		}
		if code != codes.OK && (spans[0].Status.Code != otelcodes.Error || spans[0].Status.Description != want) {
			t.Errorf("%v: status %v %q, want Error %q", code, spans[0].Status.Code, spans[0].Status.Description, want)
		}
	}
	for code, want := range map[codes.Code]string{codes.Canceled: "CANCELLED", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
		codes.PermissionDenied: "PERMISSION_DENIED", codes.OK: "OK", codes.Code(99): "CODE(99)"} {
		if got := canonicalCode(code); got != want {
			t.Errorf("canonicalCode(%d) = %q, want %q", code, got, want)
		}
	}
}
