// Tracing (docs/contracts/C4.md #ct4-traces): with tracerProvider, each
// unary gRPC call attempt is a client span started in the caller's async
// context, and that span's W3C trace context reaches the server in the
// call's metadata; without one, none is sent. The server is a grpc-js
// server in this process (lockd's generated messages) that records each
// call's metadata; the provider is the test's own, with an
// AsyncLocalStorage as its active context, as @opentelemetry/api's context
// manager for Node keeps it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  InspectRequestSchema, InspectResponseSchema, RevokeRequestSchema, RevokeResponseSchema,
} from "../../src/gen/lockd/v1/lockd_pb.js";
import { Client } from "../../src/index.js";
import type { SpanContextLike, SpanLike, TracerLike, TracerProviderLike } from "../../src/index.js";

const active = new AsyncLocalStorage<FakeSpan>();

class FakeSpan implements SpanLike {
  attributes: Record<string, string>;
  status?: { code: number; message?: string };
  ended = false;
  readonly ctx: SpanContextLike;
  constructor(readonly name: string, readonly kind: number | undefined, attrs: Record<string, string> | undefined,
    readonly parent: FakeSpan | undefined, id: number, state: string, valid: boolean) {
    this.attributes = { ...attrs };
    const traceId = parent ? parent.ctx.traceId : "0abc000000000000000000000000def0";
    this.ctx = {
      traceId: valid ? traceId : "00000000000000000000000000000000",
      spanId: valid ? id.toString(16).padStart(16, "0") : "0000000000000000",
      traceFlags: 1,
      traceState: state ? { serialize: () => state } : undefined,
    };
  }
  spanContext() { return this.ctx; }
  setAttribute(k: string, v: string) { this.attributes[k] = v; return this; }
  setStatus(s: { code: number; message?: string }) { this.status = s; return this; }
  end() { this.ended = true; }
}

class FakeProvider implements TracerProviderLike, TracerLike {
  spans: FakeSpan[] = [];
  scopes: string[] = [];
  private id = 0x1000;
  constructor(private readonly state = "", private readonly valid = true) {}
  getTracer(name: string) { this.scopes.push(name); return this; }
  startSpan(name: string, o?: { kind?: number; attributes?: Record<string, string> }) {
    const s = new FakeSpan(name, o?.kind, o?.attributes, active.getStore(), this.id++, this.state, this.valid);
    this.spans.push(s);
    return s;
  }
  root(name: string) { return new FakeSpan(name, undefined, undefined, undefined, this.id++, "", true); }
}

async function server(): Promise<{ addr: string; md: Record<string, string>[]; stop: () => void }> {
  const md: Record<string, string>[] = [];
  const record = (m: grpc.Metadata) => {
    const o: Record<string, string> = {};
    for (const [k, v] of Object.entries(m.getMap())) o[k] = String(v);
    md.push(o);
  };
  const s = new grpc.Server();
  s.addService({
    inspect: {
      path: "/lockd.v1.LockService/Inspect", requestStream: false, responseStream: false,
      requestSerialize: (v: unknown) => Buffer.from(toBinary(InspectRequestSchema, v as never)),
      requestDeserialize: (b: Buffer) => fromBinary(InspectRequestSchema, b),
      responseSerialize: (v: unknown) => Buffer.from(toBinary(InspectResponseSchema, v as never)),
      responseDeserialize: (b: Buffer) => fromBinary(InspectResponseSchema, b),
    },
    revoke: {
      path: "/lockd.v1.LockService/Revoke", requestStream: false, responseStream: false,
      requestSerialize: (v: unknown) => Buffer.from(toBinary(RevokeRequestSchema, v as never)),
      requestDeserialize: (b: Buffer) => fromBinary(RevokeRequestSchema, b),
      responseSerialize: (v: unknown) => Buffer.from(toBinary(RevokeResponseSchema, v as never)),
      responseDeserialize: (b: Buffer) => fromBinary(RevokeResponseSchema, b),
    },
  }, {
    inspect: (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      record(call.metadata);
      cb(null, create(InspectResponseSchema, { held: false }));
    },
    revoke: (call: grpc.ServerUnaryCall<unknown, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      record(call.metadata);
      cb({ code: grpc.status.INVALID_ARGUMENT, details: "no" });
    },
  });
  const port = await new Promise<number>((res, rej) =>
    s.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
  return { addr: `127.0.0.1:${port}`, md, stop: () => s.forceShutdown() };
}

const traceparent = (s: FakeSpan) => `00-${s.ctx.traceId}-${s.ctx.spanId}-01`;

test("a traced call is a client span, the child of the active span, and sends its trace context", async () => {
  const srv = await server();
  const tp = new FakeProvider("vendor=x");
  const c = new Client(srv.addr, { tracerProvider: tp });
  try {
    const parent = tp.root("app");
    await active.run(parent, () => c.inspect("k"));
    await assert.rejects(active.run(parent, () => c.revoke("k")));
    await c.inspect("k"); // no active span: a root span
    assert.deepEqual(tp.scopes, ["@lockd/client"]);
    assert.equal(tp.spans.length, 3);
    const [ok, failed, root] = tp.spans;
    for (const [i, s] of tp.spans.entries()) {
      assert.equal(s.kind, 2, "SpanKind.CLIENT");
      assert.equal(s.ended, true);
      assert.equal(srv.md[i]!["traceparent"], traceparent(s));
      assert.equal(srv.md[i]!["tracestate"], "vendor=x");
    }
    assert.equal(ok!.parent, parent);
    assert.equal(failed!.parent, parent);
    assert.equal(root!.parent, undefined);
    assert.equal(ok!.name, "lockd.v1.LockService/Inspect");
    assert.deepEqual(ok!.attributes, {
      "rpc.system.name": "grpc", "rpc.method": "lockd.v1.LockService/Inspect", "rpc.response.status_code": "OK",
    });
    assert.equal(ok!.status, undefined);
    assert.equal(failed!.attributes["rpc.response.status_code"], "INVALID_ARGUMENT");
    assert.deepEqual(failed!.status, { code: 2, message: "INVALID_ARGUMENT" });
  } finally {
    c.close();
    srv.stop();
  }
});

test("no provider, or spans that are not valid: no trace context", async () => {
  const srv = await server();
  const noop = new FakeProvider("", false);
  const a = new Client(srv.addr);
  const b = new Client(srv.addr, { tracerProvider: noop });
  try {
    await a.inspect("k");
    await b.inspect("k");
    assert.equal(srv.md.length, 2);
    for (const md of srv.md) {
      assert.equal(md["traceparent"], undefined);
      assert.equal(md["tracestate"], undefined);
    }
    assert.deepEqual(noop.spans.map((s) => s.ended), [true]);
    assert.throws(() => new Client(srv.addr, { tracerProvider: {} as TracerProviderLike }), /tracerProvider/);
  } finally {
    a.close();
    b.close();
    srv.stop();
  }
});
