// Tracing (docs/contracts/C4.md #ct4-traces, C2 #ct2-tracing): with a
// tracerProvider (the application's @opentelemetry/api TracerProvider),
// every unary gRPC call attempt is a client span and carries the W3C trace
// context of that span (traceparent, tracestate) in its metadata. The
// shapes below are the parts of the OpenTelemetry API the SDK uses, typed
// structurally: the SDK imports no OpenTelemetry package, and an
// @opentelemetry/api TracerProvider fits them.
import * as grpc from "@grpc/grpc-js";
import { InvalidArgumentError } from "./errors.js";

/** The span context the SDK reads (an @opentelemetry/api SpanContext). */
export interface SpanContextLike {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: { serialize(): string };
}

/** The span methods the SDK calls (an @opentelemetry/api Span). */
export interface SpanLike {
  spanContext(): SpanContextLike;
  setAttribute(key: string, value: string): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  end(): void;
}

/**
 * An @opentelemetry/api Tracer, as far as the SDK uses it. `startSpan`
 * without a context starts the span under the application's active context
 * (its context manager's), so the caller's current span is the parent.
 */
export interface TracerLike {
  startSpan(name: string, options?: { kind?: number; attributes?: Record<string, string> }): SpanLike;
}

/** An @opentelemetry/api TracerProvider, as far as the SDK uses it. */
export interface TracerProviderLike {
  getTracer(name: string, version?: string): TracerLike;
}

/** The instrumentation scope of the SDK's spans. */
export const TRACER_NAME = "@lockd/client";
const SPAN_KIND_CLIENT = 2; // @opentelemetry/api SpanKind.CLIENT
const STATUS_ERROR = 2; // @opentelemetry/api SpanStatusCode.ERROR
const TRACE_ID = /^[0-9a-f]{32}$/;
const SPAN_ID = /^[0-9a-f]{16}$/;

/** The client spans of one Client. */
export class Tracing {
  private readonly tracer: TracerLike;

  constructor(tp: TracerProviderLike) {
    if (typeof tp?.getTracer !== "function") {
      throw new InvalidArgumentError("tracerProvider: not an OpenTelemetry TracerProvider (no getTracer)");
    }
    this.tracer = tp.getTracer(TRACER_NAME);
  }

  /** Starts the client span of one attempt of method and writes its trace context into md. */
  start(method: string, md: grpc.Metadata): SpanLike {
    const name = `lockd.v1.LockService/${method}`;
    const span = this.tracer.startSpan(name, {
      kind: SPAN_KIND_CLIENT,
      attributes: { "rpc.system.name": "grpc", "rpc.method": name },
    });
    const sc = span.spanContext();
    if (sc && TRACE_ID.test(sc.traceId) && SPAN_ID.test(sc.spanId) && !/^0+$/.test(sc.traceId) && !/^0+$/.test(sc.spanId)) {
      md.set("traceparent", `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`);
      const ts = sc.traceState?.serialize();
      if (ts) md.set("tracestate", ts);
    }
    return span;
  }

  /** Ends span with the attempt's gRPC code (its canonical name, e.g. OK, DEADLINE_EXCEEDED). */
  end(span: SpanLike, code: number): void {
    const name = grpc.status[code] ?? "UNKNOWN";
    span.setAttribute("rpc.response.status_code", name);
    if (code !== grpc.status.OK) span.setStatus({ code: STATUS_ERROR, message: name });
    span.end();
  }
}
