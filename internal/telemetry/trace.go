package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span names and attributes of the backends (C4 #ct4-traces). A lock key is
// never an attribute.
const (
	SpanCommit   = "lockd.backend.commit"
	SpanWait     = "lockd.wait"
	AttrBackend  = "lockd.backend"
	AttrBatch    = "lockd.batch.size"
	tracingScope = "lock.dev/lockd/store"
)

// Span is a backend span, or nil when the caller's call is not traced: its
// methods do nothing on nil, so an untraced call records nothing.
type Span struct{ s trace.Span }

// StartCommit starts the span of one group commit (C4 #ct4-traces) whose
// traced callers' contexts are traced (at least one, the first its
// parent): the child of the first and linked to every other. The tracer
// is the first caller's span's provider, so a backend has no tracing
// configuration of its own: with tracing off no caller's context carries a
// span and nobody calls this (groupcommit.Traced).
func StartCommit(backend string, size int, traced []context.Context) *Span {
	if len(traced) == 0 {
		return nil
	}
	parent := trace.SpanFromContext(traced[0])
	links := make([]trace.Link, 0, len(traced)-1)
	for _, c := range traced[1:] {
		links = append(links, trace.Link{SpanContext: trace.SpanContextFromContext(c)})
	}
	_, s := parent.TracerProvider().Tracer(tracingScope).Start(traced[0], SpanCommit,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String(AttrBackend, backend), attribute.Int(AttrBatch, size)))
	return &Span{s}
}

// EndCommit ends a commit span; err is the first failure of the commit's
// requests, already classified (its kind, never its text, is recorded).
func (sp *Span) EndCommit(err error) {
	if sp == nil {
		return
	}
	if kind := ErrorKind(err); kind != "" {
		sp.s.SetStatus(codes.Error, kind)
	}
	sp.s.End()
}

// StartWait starts the wait span of an Acquire that found its key busy (C4
// #ct4-traces), the child of the call's span, and returns the context the
// rest of the wait runs under (its grant's commit becomes the wait's child).
// An untraced ctx returns ctx and nil: nothing is recorded, nothing
// allocated.
func StartWait(ctx context.Context, backend string) (context.Context, *Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, nil
	}
	ctx, s := parent.TracerProvider().Tracer(tracingScope).Start(ctx, SpanWait,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attribute.String(AttrBackend, backend)))
	return ctx, &Span{s}
}

// EndWait ends a wait span with the Acquire's outcome: a failure's status
// is its lockd_lock_acquire_total result (C4 #ct4-acquire-result).
func (sp *Span) EndWait(ctx context.Context, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.s.SetStatus(codes.Error, AcquireResult(ctx, err))
	}
	sp.s.End()
}
