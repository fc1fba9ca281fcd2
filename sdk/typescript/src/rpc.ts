// The wire: lockd's LockService over @grpc/grpc-js, with messages encoded by
// @bufbuild/protobuf from the code generated into src/gen (make generate-ts).
// LockApi is what the rest of the SDK sees; the unit tests give it a fake.
// grpcApi keeps one channel per address and sends every call to the replica
// in use, moving on when one fails, drains or stalls (C2 #ct2-failover).
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import {
  LockService,
  type AcquireRequest, type AcquireResponse, type CloseSessionRequest, type CloseSessionResponse,
  type CloseSessionsRequest, type CloseSessionsResponse,
  type CheckTokenRequest, type CheckTokenResponse, type HotKeysRequest, type HotKeysResponse, type InspectRequest, type InspectResponse, type KeepAliveRequest, type KeepAliveResponse,
  type LeaveQueueRequest, type LeaveQueueResponse, type ListRequest, type ListResponse,
  type ListSessionsRequest, type ListSessionsResponse, type OpenSessionRequest, type OpenSessionResponse,
  type ReleaseRequest, type ReleaseResponse, type RevokeRequest, type RevokeResponse,
  type SetValueRequest, type SetValueResponse, type WatchRequest, type WatchResponse,
} from "./gen/lockd/v1/lockd_pb.js";
import { fromGrpcError, UnavailableError } from "./errors.js";
import { Replicas } from "./replicas.js";
import type { Tracing } from "./trace.js";

/** Options of one call. */
export interface CallOpts {
  signal?: AbortSignal;
}

/** A bidirectional stream: the KeepAlive stream. */
export interface BidiStream<I, O> {
  /** The address of the replica this stream goes to. */
  readonly peer: string;
  send(m: I): void;
  /** Registers the handlers; called once, before any message arrives. */
  start(onMessage: (m: O) => void, onEnd: (err: unknown) => void): void;
  /** Cuts the stream; onEnd is not called afterwards. */
  cancel(): void;
}

/** A server stream: Watch. */
export interface ServerStream<O> {
  readonly peer: string;
  start(onMessage: (m: O) => void, onEnd: (err: unknown) => void): void;
  cancel(): void;
}

/** The calls of lockd's LockService the SDK makes. Errors are already mapped (errors.ts). */
export interface LockApi {
  openSession(req: OpenSessionRequest, o?: CallOpts): Promise<OpenSessionResponse>;
  closeSession(req: CloseSessionRequest, o?: CallOpts): Promise<CloseSessionResponse>;
  acquire(req: AcquireRequest, o?: CallOpts): Promise<AcquireResponse>;
  leaveQueue(req: LeaveQueueRequest, o?: CallOpts): Promise<LeaveQueueResponse>;
  release(req: ReleaseRequest, o?: CallOpts): Promise<ReleaseResponse>;
  setValue(req: SetValueRequest, o?: CallOpts): Promise<SetValueResponse>;
  inspect(req: InspectRequest, o?: CallOpts): Promise<InspectResponse>;
  checkToken(req: CheckTokenRequest, o?: CallOpts): Promise<CheckTokenResponse>;
  list(req: ListRequest, o?: CallOpts): Promise<ListResponse>;
  revoke(req: RevokeRequest, o?: CallOpts): Promise<RevokeResponse>;
  listSessions(req: ListSessionsRequest, o?: CallOpts): Promise<ListSessionsResponse>;
  closeSessions(req: CloseSessionsRequest, o?: CallOpts): Promise<CloseSessionsResponse>;
  hotKeys(req: HotKeysRequest, o?: CallOpts): Promise<HotKeysResponse>;
  keepAlive(): BidiStream<KeepAliveRequest, KeepAliveResponse>;
  watch(req: WatchRequest): ServerStream<WatchResponse>;
  /**
   * Sets the replica at `peer` aside (it drains or stalled) so that the next
   * call goes elsewhere; false when there is nowhere else to go (one address,
   * or, for a stall, every other address already set aside).
   */
  setAside(peer: string, draining: boolean): boolean;
  /** Lets the replicas set aside be tried again (nothing answered). */
  clearAside(): void;
  /** Whether the client has several addresses (failover applies). */
  readonly several: boolean;
  close(): void;
}

/** Builds a message of a generated schema (re-exported for the SDK's modules). */
export function msg<D extends DescMessage>(schema: D, init?: MessageInitShape<D>): MessageShape<D> {
  return create(schema, init);
}

/** What grpcApi needs to reach the replicas. */
export interface ChannelConfig {
  addresses: string[];
  credentials: grpc.ChannelCredentials;
  /** Per-call metadata (the bearer token), or undefined. */
  metadata?: () => grpc.Metadata;
  /** Overrides the TLS server name (tests, IP addresses in certificates). */
  serverName?: string;
  now: () => number;
  /** Client spans and W3C trace context of unary calls (C4 #ct4-traces), or undefined. */
  tracing?: Tracing;
  /**
   * The client's backoff bounds (C2 #ct2-sdk rule 11): the channel's own connection backoff starts at the first and
   * is capped at the second, not grpc-js's 1 s growing to 120 s. Defaults 50 and 2000 ms.
   */
  backoffMinMs?: number;
  backoffMaxMs?: number;
}

type Method = (typeof LockService.method)[keyof typeof LockService.method];

/** A method's path and (de)serialisers, made once per method rather than per call. */
interface Wire {
  path: string;
  ser: (v: never) => Buffer;
  de: (b: Buffer) => unknown;
}
const wires = new Map<string, Wire>();
function wireOf(m: Method): Wire {
  let w = wires.get(m.name);
  if (!w) {
    w = {
      path: `/${LockService.typeName}/${m.name}`,
      ser: (v: never) => Buffer.from(toBinary(m.input, v)),
      de: (b: Buffer) => fromBinary(m.output, b),
    };
    wires.set(m.name, w);
  }
  return w;
}

/**
 * The calls in flight per signal, cancelled by one abort listener per signal
 * rather than one per call: many sessions' calls share a signal (the
 * client's), and EventTarget's add/removeEventListener walk every listener
 * the signal has (issue 25 SDK-TS CPU). Returns the call's untrack.
 */
const inFlight = new WeakMap<AbortSignal, Set<() => void>>();
function cancelOnAbort(signal: AbortSignal, cancel: () => void): () => void {
  let calls = inFlight.get(signal);
  if (!calls) {
    const set = new Set<() => void>();
    calls = set;
    inFlight.set(signal, set);
    signal.addEventListener("abort", () => {
      const all = [...set];
      set.clear();
      for (const f of all) f();
    }, { once: true });
  }
  const set = calls;
  set.add(cancel);
  return () => {
    set.delete(cancel);
  };
}

/** The grpc-js implementation of LockApi. */
export class GrpcApi implements LockApi {
  private readonly channels = new Map<string, grpc.Client>();
  private readonly replicas: Replicas;
  private closed = false;

  constructor(private readonly cfg: ChannelConfig) {
    this.replicas = new Replicas(cfg.addresses, cfg.now);
  }

  get several(): boolean {
    return this.replicas.several;
  }

  /** @internal the address the next call goes to (the chaos worker's hold lines name it) */
  address(): string {
    return this.replicas.pick();
  }

  private channel(addr: string): grpc.Client {
    let ch = this.channels.get(addr);
    if (!ch) {
      const opts: grpc.ChannelOptions = {
        "grpc.initial_reconnect_backoff_ms": this.cfg.backoffMinMs ?? 50,
        "grpc.max_reconnect_backoff_ms": this.cfg.backoffMaxMs ?? 2000,
        // No channelz registry: nothing reads it, and it traces and counts every call (issue 25 SDK-TS CPU).
        "grpc.enable_channelz": 0,
      };
      if (this.cfg.serverName) opts["grpc.ssl_target_name_override"] = this.cfg.serverName;
      ch = new grpc.Client(addr, this.cfg.credentials, opts);
      this.channels.set(addr, ch);
    }
    return ch;
  }

  setAside(peer: string, draining: boolean): boolean {
    return this.replicas.setAside(peer, draining);
  }

  clearAside(): void {
    this.replicas.clearAside();
  }

  private metadata(): grpc.Metadata {
    return this.cfg.metadata?.() ?? new grpc.Metadata();
  }

  private unary<M extends Method>(m: M, req: MessageShape<M["input"]>, o?: CallOpts): Promise<MessageShape<M["output"]>> {
    if (this.closed) return Promise.reject(new UnavailableError("client closed"));
    const addr = this.replicas.pick();
    const w = wireOf(m);
    return new Promise((resolve, reject) => {
      if (o?.signal?.aborted) {
        reject(o.signal.reason);
        return;
      }
      let moved = false;
      const move = () => {
        moved = true;
        call.cancel();
      };
      const done = this.replicas.track(addr, move);
      let untrack: (() => void) | undefined;
      const md = this.metadata();
      const tracing = this.cfg.tracing;
      const span = tracing?.start(m.name, md);
      const call = this.channel(addr).makeUnaryRequest(
        w.path,
        w.ser as (v: MessageShape<M["input"]>) => Buffer,
        w.de as (b: Buffer) => MessageShape<M["output"]>,
        req,
        md,
        {},
        (err, resp) => {
          untrack?.();
          done();
          if (span) tracing!.end(span, err ? (err.code ?? grpc.status.UNKNOWN) : grpc.status.OK);
          if (o?.signal?.aborted) {
            reject(o.signal.reason);
            return;
          }
          if (moved) {
            reject(new UnavailableError(`${m.name}: moved off replica ${addr}, set aside`));
            return;
          }
          if (err) {
            const mapped = fromGrpcError(err);
            this.replicas.answered(addr, mapped);
            reject(mapped);
            return;
          }
          resolve(resp!);
        },
      );
      if (o?.signal) untrack = cancelOnAbort(o.signal, () => call.cancel());
    });
  }

  openSession(req: OpenSessionRequest, o?: CallOpts) { return this.unary(LockService.method.openSession, req, o); }
  closeSession(req: CloseSessionRequest, o?: CallOpts) { return this.unary(LockService.method.closeSession, req, o); }
  acquire(req: AcquireRequest, o?: CallOpts) { return this.unary(LockService.method.acquire, req, o); }
  leaveQueue(req: LeaveQueueRequest, o?: CallOpts) { return this.unary(LockService.method.leaveQueue, req, o); }
  release(req: ReleaseRequest, o?: CallOpts) { return this.unary(LockService.method.release, req, o); }
  setValue(req: SetValueRequest, o?: CallOpts) { return this.unary(LockService.method.setValue, req, o); }
  inspect(req: InspectRequest, o?: CallOpts) { return this.unary(LockService.method.inspect, req, o); }
  checkToken(req: CheckTokenRequest, o?: CallOpts) { return this.unary(LockService.method.checkToken, req, o); }
  list(req: ListRequest, o?: CallOpts) { return this.unary(LockService.method.list, req, o); }
  revoke(req: RevokeRequest, o?: CallOpts) { return this.unary(LockService.method.revoke, req, o); }
  listSessions(req: ListSessionsRequest, o?: CallOpts) { return this.unary(LockService.method.listSessions, req, o); }
  closeSessions(req: CloseSessionsRequest, o?: CallOpts) { return this.unary(LockService.method.closeSessions, req, o); }
  hotKeys(req: HotKeysRequest, o?: CallOpts) { return this.unary(LockService.method.hotKeys, req, o); }

  keepAlive(): BidiStream<KeepAliveRequest, KeepAliveResponse> {
    const m = LockService.method.keepAlive;
    const addr = this.replicas.pick();
    const call = this.channel(addr).makeBidiStreamRequest(
      `/${LockService.typeName}/${m.name}`,
      (v: KeepAliveRequest) => Buffer.from(toBinary(m.input, v)),
      (b: Buffer) => fromBinary(m.output, b),
      this.metadata(),
    );
    return this.wrap(addr, call, (v) => call.write(v));
  }

  watch(req: WatchRequest): ServerStream<WatchResponse> {
    const m = LockService.method.watch;
    const addr = this.replicas.pick();
    const call = this.channel(addr).makeServerStreamRequest(
      `/${LockService.typeName}/${m.name}`,
      (v: WatchRequest) => Buffer.from(toBinary(m.input, v)),
      (b: Buffer) => fromBinary(m.output, b),
      req,
      this.metadata(),
    );
    return this.wrap(addr, call, () => undefined);
  }

  private wrap<I, O>(addr: string, call: grpc.ClientReadableStream<O>, write: (m: I) => void): BidiStream<I, O> {
    let cancelled = false;
    let ended = false;
    let onEnd: (err: unknown) => void = () => undefined;
    const end = (err: unknown) => {
      if (ended || cancelled) return;
      ended = true;
      const mapped = fromGrpcError(err);
      this.replicas.answered(addr, mapped);
      onEnd(mapped);
    };
    return {
      peer: addr,
      send: (v: I) => {
        if (!ended && !cancelled) write(v);
      },
      start: (onMessage, onEndCb) => {
        onEnd = onEndCb;
        call.on("data", (v: O) => {
          if (!cancelled) onMessage(v);
        });
        call.on("error", (err) => end(err));
        // An error status is reported by "error"; an "end" without one is a
        // stream the server closed (looked at after "error" had its turn).
        call.on("end", () => setImmediate(() => end(new UnavailableError("stream ended"))));
      },
      cancel: () => {
        if (cancelled) return;
        cancelled = true;
        call.cancel();
      },
    };
  }

  close(): void {
    this.closed = true;
    for (const ch of this.channels.values()) ch.close();
    this.channels.clear();
  }
}
