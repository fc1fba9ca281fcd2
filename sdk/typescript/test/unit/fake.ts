// A fake clock and a scripted fake of lockd's API for the timing rules'
// unit tests: the SDK's own arithmetic and schedule, checked exactly. What
// the server does is tested against a real lockd (test/integration).
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { Clock, Timer } from "../../src/clock.js";
import {
  AcquireResponseSchema, CloseSessionResponseSchema, InspectResponseSchema, KeepAliveResponseSchema,
  LeaveQueueResponseSchema, OpenSessionResponseSchema, ReleaseResponseSchema, SetValueResponseSchema,
  WatchResponseSchema, type AcquireRequest, type KeepAliveRequest, type KeepAliveResponse, type ReleaseRequest,
  type WatchRequest, type WatchResponse,
} from "../../src/gen/lockd/v1/lockd_pb.js";
import type { BidiStream, LockApi, ServerStream } from "../../src/rpc.js";
import { UnavailableError } from "../../src/errors.js";

/** A clock that moves only when told; timers fire in order of their due time. */
export class FakeClock implements Clock {
  private t = 1_000_000;
  private timers: { at: number; f: () => void; live: boolean; seq: number }[] = [];
  private seq = 0;
  now(): number {
    return this.t;
  }
  setTimer(ms: number, f: () => void): Timer {
    const tm = { at: this.t + Math.max(0, ms), f, live: true, seq: this.seq++ };
    this.timers.push(tm);
    return { cancel: () => void (tm.live = false) };
  }
  /** Moves the clock by ms, firing every timer due on the way at its own time. */
  advance(ms: number): void {
    const target = this.t + ms;
    for (;;) {
      this.timers = this.timers.filter((x) => x.live);
      const due = this.timers.filter((x) => x.at <= target).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!due) break;
      due.live = false;
      this.t = Math.max(this.t, due.at);
      due.f();
    }
    this.t = target;
  }
  /** Whether a timer is due in [from, to]. */
  pending(from: number, to: number): boolean {
    return this.timers.some((x) => x.live && x.at >= from && x.at <= to);
  }
}

/** Lets promise chains settle (several macrotask turns). */
export async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

/** A KeepAlive request as the fake server saw it, with the fake clock's time of its send. */
export interface Sent {
  req: KeepAliveRequest;
  at: number;
}

export class FakeStream implements BidiStream<KeepAliveRequest, KeepAliveResponse> {
  readonly peer = "fake:1";
  sent: Sent[] = [];
  cancelled = false;
  private onMessage?: (m: KeepAliveResponse) => void;
  private onEnd?: (err: unknown) => void;
  constructor(private readonly clock: FakeClock) {}
  send(m: KeepAliveRequest): void {
    this.sent.push({ req: m, at: this.clock.now() });
  }
  start(onMessage: (m: KeepAliveResponse) => void, onEnd: (err: unknown) => void): void {
    this.onMessage = onMessage;
    this.onEnd = onEnd;
  }
  cancel(): void {
    this.cancelled = true;
  }
  /** Delivers a reply to the client. */
  reply(r: MessageInitShape<typeof KeepAliveResponseSchema>): void {
    this.onMessage?.(create(KeepAliveResponseSchema, r));
  }
  /** Answers the last request sent: live, with `remainingMs` and the held set given. */
  answerLast(remainingMs: number, held?: { key: string; token: bigint }[], extra: MessageInitShape<typeof KeepAliveResponseSchema> = {}): Sent {
    const last = this.sent[this.sent.length - 1]!;
    const r: MessageInitShape<typeof KeepAliveResponseSchema> = {
      sessionId: last.req.sessionId, requestId: last.req.requestId, live: true, remainingMs: BigInt(remainingMs), ...extra,
    };
    if (held) r.held = { locks: held };
    this.reply(r);
    return last;
  }
  /** Breaks the stream (the connection was cut). */
  fail(): void {
    this.onEnd?.(new UnavailableError("stream broken"));
  }
}

/** What the fake server answers; the hooks run while a request is "at the server". */
export interface FakeConfig {
  ttlMs: number;
  marginMs: number;
  intervalMs: number;
  remainingMs: number;
  duringOpen?: () => void;
  duringAcquire?: () => void;
}

/** A Watch stream the test feeds. */
export class FakeWatch implements ServerStream<WatchResponse> {
  readonly peer: string;
  cancelled = false;
  private onMessage?: (m: WatchResponse) => void;
  constructor(readonly req: WatchRequest, n: number) {
    this.peer = `fake:${n}`;
  }
  start(onMessage: (m: WatchResponse) => void): void {
    this.onMessage = onMessage;
  }
  cancel(): void {
    this.cancelled = true;
  }
  send(m: MessageInitShape<typeof WatchResponseSchema>): void {
    this.onMessage?.(create(WatchResponseSchema, m));
  }
}

export class FakeApi implements LockApi {
  several = false;
  watches: FakeWatch[] = [];
  asides: string[] = [];
  streams: FakeStream[] = [];
  releases: ReleaseRequest[] = [];
  acquires: AcquireRequest[] = [];
  private token = 100n;
  constructor(private readonly clock: FakeClock, public cfg: FakeConfig) {}
  get stream(): FakeStream {
    return this.streams[this.streams.length - 1]!;
  }
  async openSession() {
    this.cfg.duringOpen?.();
    return create(OpenSessionResponseSchema, {
      sessionId: "S1", sessionSecret: new Uint8Array([1, 2, 3]), ttlMs: BigInt(this.cfg.ttlMs),
      remainingMs: BigInt(this.cfg.remainingMs), safetyMarginMs: BigInt(this.cfg.marginMs),
      heartbeatIntervalMs: BigInt(this.cfg.intervalMs),
    });
  }
  async closeSession() {
    return create(CloseSessionResponseSchema, {});
  }
  async acquire(req: AcquireRequest) {
    this.acquires.push(req);
    this.cfg.duringAcquire?.();
    return create(AcquireResponseSchema, { granted: true, key: req.key, token: ++this.token, remainingMs: BigInt(this.cfg.remainingMs) });
  }
  async leaveQueue() {
    return create(LeaveQueueResponseSchema, {});
  }
  async release(req: ReleaseRequest) {
    this.releases.push(req);
    return create(ReleaseResponseSchema, {});
  }
  async setValue() {
    return create(SetValueResponseSchema, {});
  }
  async inspect() {
    return create(InspectResponseSchema, {});
  }
  checkToken(): never {
    throw new Error("not in the fake");
  }
  list(): never {
    throw new Error("not in the fake");
  }
  revoke(): never {
    throw new Error("not in the fake");
  }
  listSessions(): never {
    throw new Error("not in the fake");
  }
  closeSessions(): never {
    throw new Error("not in the fake");
  }
  hotKeys(): never {
    throw new Error("not in the fake");
  }
  keepAlive(): FakeStream {
    const s = new FakeStream(this.clock);
    this.streams.push(s);
    return s;
  }
  watch(req: WatchRequest): FakeWatch {
    const w = new FakeWatch(req, this.watches.length + 1);
    this.watches.push(w);
    return w;
  }
  setAside(peer: string): boolean {
    this.asides.push(peer);
    return this.several;
  }
  clearAside(): void {}
  close(): void {}
}
