"""Tracing (docs/contracts/C4.md #ct4-traces, C2 #ct2-tracing): with a
``tracer_provider`` (an ``opentelemetry.trace.TracerProvider``, the
application's), every unary RPC attempt the SDK sends is a client span and
carries W3C trace context (``traceparent``, ``tracestate``) in its
metadata. The SDK imports the opentelemetry-api package only then: it is not
among its dependencies. The trace context is formatted here from the span's
own context, never by a propagator of the application's."""

from __future__ import annotations

import grpc

from . import errors

SCOPE = "lockd"
PREFIX = "lockd.v1.LockService/"


class Tracing:
    def __init__(self, tp):
        try:
            from opentelemetry import trace as ot
        except ImportError:
            raise errors.InvalidArgument("tracer_provider: needs the opentelemetry-api package (opentelemetry.trace)",
                                         field="tracer_provider") from None
        if not hasattr(tp, "get_tracer"):
            raise errors.InvalidArgument("tracer_provider: not an OpenTelemetry TracerProvider (no get_tracer)",
                                         field="tracer_provider")
        self._kind = ot.SpanKind.CLIENT
        self._status, self._error = ot.Status, ot.StatusCode.ERROR
        self._tracer = tp.get_tracer(SCOPE)

    def start(self, method: str, metadata: tuple):
        """Starts the client span of one attempt of method, the child of the
        caller's current span; returns (span, metadata with its trace context)."""
        name = PREFIX + method
        span = self._tracer.start_span(name, kind=self._kind,
                                       attributes={"rpc.system.name": "grpc", "rpc.method": name})
        sc = span.get_span_context()
        if sc is None or not sc.is_valid:
            return span, metadata
        md = metadata + (("traceparent", f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags) & 0xFF:02x}"),)
        ts = sc.trace_state.to_header() if sc.trace_state else ""
        if ts:
            md += (("tracestate", ts),)
        return span, md

    def end(self, span, code: grpc.StatusCode) -> None:
        """Ends span with the attempt's gRPC code (its canonical name, e.g. OK, DEADLINE_EXCEEDED)."""
        name = code.name
        span.set_attribute("rpc.response.status_code", name)
        if code != grpc.StatusCode.OK:
            span.set_status(self._status(self._error, name))
        span.end()


def tracing(tp):
    return Tracing(tp) if tp is not None else None
