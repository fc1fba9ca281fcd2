// Session: the unit of liveness that locks live in, and the trust rules of
// C2 #ct2-deadline and #ct2-confirm (the Go SDK's session.go and deadline.go).
import { create } from "@bufbuild/protobuf";
import type { Timer } from "./clock.js";
import {
  ClosedError, InvalidArgumentError, LockLostError, MaxHoldError, PermissionDeniedError, SessionDeadError,
  SessionExpiredError,
} from "./errors.js";
import {
  CloseSessionRequestSchema, LockLostReason, OpenSessionRequestSchema, ReleaseRequestSchema, type HeldLocks, type LockLost,
} from "./gen/lockd/v1/lockd_pb.js";
import { checkLabels, checkLockDelay, checkOwner, checkTiming, checkWholeMs } from "./limits.js";
import type { Client } from "./client.js";
import { Lock } from "./lock.js";
import { acquire, tryAcquire, type AcquireOptions, type TryAcquireOptions } from "./acquire.js";
import { acquireAll, tryAcquireAll, type AcquireAllOptions, type TryAcquireAllOptions } from "./acquire_all.js";
import { campaign, type Leadership } from "./election.js";

/** Options of {@link Client.newSession}. */
export interface SessionOptions {
  /** The session's TTL in whole milliseconds (2 s..1 h); default: the client's `ttlMs`, else the server's. */
  ttlMs?: number;
  /** Who holds the session's locks, shown by inspect/list/watch (C2 #ct2-holder). */
  owner?: string;
  labels?: Record<string, string>;
  /** A lock-delay sent with every plain Acquire of the session (C2 #ct2-delay). */
  lockDelayMs?: number;
  /** Gives up opening (retries of an unreachable server) when aborted. */
  signal?: AbortSignal;
}

/**
 * The instant a reply's Remaining counts from: `sent`, the client's time when
 * it sent the request the reply answers, never the time the reply arrived
 * (C2 #ct2-deadline). The server measured Remaining from its receipt of the
 * request, which is later than `sent`; counting from the reply's arrival
 * would add the reply's transit to the client's trust.
 */
function trustFrom(sent: number, arrived: number): number {
  return RECV_TIME_CONTROL ? arrived : sent;
}

/**
 * The receive-time control (the Go SDK's lockd_recvtime_control build tag,
 * the Python SDK's LOCKD_PYSDK_CONTROL): with LOCKD_TSSDK_CONTROL=recvtime in
 * the environment, {@link trustFrom} counts Remaining from the reply's
 * arrival, which breaks C2 #ct2-deadline on purpose so that the chaos
 * checkers can show they catch it. Never set it for real locks.
 */
const RECV_TIME_CONTROL = typeof process !== "undefined" && process.env["LOCKD_TSSDK_CONTROL"] === "recvtime";
if (RECV_TIME_CONTROL) {
  process.emitWarning("LOCKD_TSSDK_CONTROL=recvtime: this SDK breaks the send-time rule on purpose (a test control); never use it for real locks");
}

/**
 * The error of a lock that no answer confirms any more, found at now (client
 * clock, ms): MaxHoldError once its maximum hold may have run out, else
 * LockLostError (C2 #ct2-maxhold-sdk; the Go SDK's Lock.unconfirmed). The
 * Acquire's send time plus maxHoldMs is a lower bound of the hold's end on
 * the server, so before it the hold cannot be why. A notice that comes later
 * changes nothing: a lock keeps its first error.
 */
function unconfirmed(l: Lock, now: number, why: string): LockLostError {
  if (l.maxHoldAt > 0 && now >= l.maxHoldAt) return new MaxHoldError(`lock lost: ${why} (its maximum hold had run out)`);
  return new LockLostError(`lock lost: ${why}`);
}

/** Notice ids kept per key at most (Session.lostTok), as the Go SDK's maxLostKeys. */
const MAX_LOST_KEYS = 4096;

/**
 * A lockd session: the unit of liveness that locks live in. The client keeps
 * it alive with heartbeats on its shared KeepAlive stream.
 *
 * It is trusted until its deadline: the client's monotonic time when it sent
 * the latest answered request, plus the Remaining the server granted, minus
 * the safety margin (C2 #ct2-deadline). {@link signal} aborts, and every lock
 * of the session is lost, at that instant unless a newer answer extended it —
 * also when the server is unreachable and no answer comes at all. A session
 * whose signal aborted is never used again; open a new one.
 */
export class Session {
  /** @internal */ readonly secret: Uint8Array;
  /** @internal */ readonly lockDelayMs: number;
  /** @internal */ locks = new Map<string, Lock>();
  /** @internal */ lockSeq = 0;
  /** @internal the highest token a lock-lost notice (or an orphan release) named, per key */
  lostTok = new Map<string, bigint>();
  /** @internal notice ids to acknowledge on the stream numbered ackGen */
  acks: bigint[] = [];
  /** @internal */ ackGen = 0;
  /** @internal background LeaveQueue calls by key */
  leaving = new Map<string, { abort: AbortController; done: Promise<void> }>();
  /** @internal Acquire calls and releases under way, per key */
  busy = new Map<string, number>();

  private _deadline: number;
  private timer?: Timer;
  private timerAt = Infinity;
  private _err?: Error;
  private readonly ac = new AbortController();
  private _callSignal?: AbortSignal;
  private closedOK = false;

  /** @internal use {@link Client.newSession} */
  constructor(
    /** @internal */ readonly client: Client,
    /** The session id (public: inspect, list and watch show it). */
    readonly id: string,
    secret: Uint8Array,
    /** The TTL the backend applies, in milliseconds. */
    readonly ttlMs: number,
    /** The safety margin in force, in milliseconds. */
    readonly marginMs: number,
    /** The heartbeat interval in force, in milliseconds. */
    readonly intervalMs: number,
    lockDelayMs: number,
    deadline: number,
  ) {
    this.secret = secret;
    this.lockDelayMs = lockDelayMs;
    this._deadline = deadline;
  }

  /** @internal NewSession: opens a session on the server and checks the timing it would run with. */
  static async open(c: Client, so: SessionOptions): Promise<Session> {
    const ttl = so.ttlMs ?? c.opts.ttlMs ?? 0;
    checkWholeMs("ttl", ttl);
    checkOwner(so.owner ?? "");
    checkLabels(so.labels ?? {});
    checkLockDelay(so.lockDelayMs ?? 0);
    // The client's own settings against the TTL asked for, before the server opens anything.
    checkTiming(ttl, c.opts.safetyMarginMs ?? 0, c.opts.heartbeatIntervalMs ?? 0);
    let sent = 0;
    const resp = await c.retry(so.signal, (signal) => {
      sent = c.clock.now();
      return c.api.openSession(
        create(OpenSessionRequestSchema, { ttlMs: BigInt(ttl), owner: so.owner ?? "", labels: so.labels ?? {} }),
        { signal },
      );
    });
    const ttlMs = Number(resp.ttlMs);
    let margin = Number(resp.safetyMarginMs);
    if ((c.opts.safetyMarginMs ?? 0) > 0) margin = c.opts.safetyMarginMs!;
    const own = c.opts.heartbeatIntervalMs ?? 0;
    let interval = own > 0 ? own : Number(resp.heartbeatIntervalMs);
    if (interval <= 0) interval = ttlMs / 3;
    const s = new Session(c, resp.sessionId, resp.sessionSecret, ttlMs, margin, interval, so.lockDelayMs ?? 0,
      trustFrom(sent, c.clock.now()) + Number(resp.remainingMs) - margin);
    // The settings in force (the client's, else the server's) against the
    // TTL the backend applies: refuse a margin or interval it cannot carry.
    try {
      if (margin <= 0 || ttlMs <= 0) {
        throw new InvalidArgumentError(`safety margin ${margin} ms must be > 0 and < ttl/2 (ttl ${ttlMs} ms)`);
      }
      if (own > 0) {
        checkTiming(ttlMs, margin, own);
      } else {
        checkTiming(ttlMs, margin, 0);
        if (s.intervalMs >= ttlMs - margin) {
          throw new InvalidArgumentError(
            `the server's heartbeat interval ${s.intervalMs} ms must be below ttl − safety margin = ${ttlMs - margin} ms`);
        }
      }
    } catch (e) {
      s.abandon();
      throw e;
    }
    if (c.clock.now() >= s._deadline) {
      s.abandon();
      throw new SessionExpiredError("session expired before its open answer arrived");
    }
    s.arm();
    c.ka.add(s);
    return s;
  }

  /** Aborts when the session can no longer be trusted; its reason is {@link err}. */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  /** @internal the session's signal and the client's combined, made once for every call of the session */
  get callSignal(): AbortSignal {
    return this._callSignal ??= AbortSignal.any([this.ac.signal, this.client.signal]);
  }

  /** Undefined while the session is trusted; afterwards a SessionExpiredError, SessionDeadError or ClosedError. */
  get err(): Error | undefined {
    return this._err;
  }

  /** The instant (on the client's clock, ms) at which the session stops being trusted unless an answer extends it. */
  get deadline(): number {
    return this._deadline;
  }

  /** Whether the session is trusted now: not ended, and the clock is before its deadline. */
  valid(): boolean {
    return this._err === undefined && this.client.clock.now() < this._deadline;
  }

  /**
   * Takes the lock named `key`, waiting in the key's FIFO queue until it is
   * granted, `signal` aborts, `waitTimeoutMs` runs out (WaitTimeoutError), or
   * the session ends. The session keeps its place in the queue across
   * retries and replicas (C2 #ct2-keep-place) and gives it up when the call
   * returns without a grant.
   */
  acquire(key: string, opts: AcquireOptions = {}): Promise<Lock> {
    return acquire(this, key, opts);
  }

  /** Takes the lock if it is free and nobody waits for it; otherwise LockedError at once. */
  tryAcquire(key: string, opts: TryAcquireOptions = {}): Promise<Lock> {
    return tryAcquire(this, key, opts);
  }

  /**
   * Takes every lock of `keys` at once, or none (C2 #ct2-acquire-all): the
   * server takes them in ascending key order, each in its FIFO queue, so two
   * sessions asking for overlapping keys in different orders never deadlock.
   * Resolves to one Lock per key, in the order of `keys`, each with its key's
   * own fencing token; waits until granted, `signal` aborts, `waitTimeoutMs`
   * runs out for the whole set (WaitTimeoutError) or the session ends; a wait
   * that closes a cycle of waiting sessions is DeadlockError. On any error
   * the session holds none of the keys it did not hold before. 1 to 64
   * distinct keys, plain locks only.
   */
  acquireAll(keys: string[], opts: AcquireAllOptions = {}): Promise<Lock[]> {
    return acquireAll(this, keys, opts);
  }

  /** Takes every lock of `keys` if each is free and nobody waits for it; otherwise LockedError and none. */
  tryAcquireAll(keys: string[], opts: TryAcquireAllOptions = {}): Promise<Lock[]> {
    return tryAcquireAll(this, keys, opts);
  }

  /** Campaigns in the election `name` (C2 #ct2-election): waits until this session leads. */
  campaign(name: string, value: Uint8Array | string, opts: { signal?: AbortSignal } = {}): Promise<Leadership> {
    return campaign(this, name, value, opts);
  }

  /** @internal (re)arms the deadline timer at the earliest of the session's and its locks' deadlines. */
  arm(): void {
    this.timer?.cancel();
    const at = this.earliest();
    this.timerAt = at;
    const clock = this.client.clock;
    this.timer = clock.setTimer(at - clock.now(), () => this.deadlineReached());
  }

  /** @internal the earliest of the session's and its locks' deadlines */
  earliest(): number {
    let at = this._deadline;
    for (const l of this.locks.values()) if (l.ownDeadline < at) at = l.ownDeadline;
    return at;
  }

  private deadlineReached(): void {
    if (this._err) return;
    const now = this.client.clock.now();
    if (now >= this._deadline) {
      this.end(new SessionExpiredError());
      return;
    }
    // A lock whose own deadline passed: no answer confirmed it since.
    const lost: Lock[] = [];
    for (const [key, l] of this.locks) {
      if (now >= l.ownDeadline) {
        this.locks.delete(key);
        lost.push(l);
      }
    }
    this.arm(); // extended since armed
    for (const l of lost) l.end(unconfirmed(l, now, "not confirmed by the server before its deadline"));
  }

  /**
   * @internal Applies an answer to a request sent at `sent` that does not
   * list locks (an open or grant reply): the session's deadline becomes the
   * later of the current one and sent + remaining − margin; its locks are not
   * extended. A deadline already passed is never revived. Returns the bound.
   */
  extend(sent: number, remainingMs: number): number {
    const d = trustFrom(sent, this.client.clock.now()) + remainingMs - this.marginMs;
    if (this._err) return d;
    if (this.client.clock.now() >= this._deadline) {
      this.end(new SessionExpiredError());
      return d;
    }
    if (d > this._deadline) this._deadline = d; // the timer finds it when it fires
    return d;
  }

  /**
   * @internal Applies a heartbeat answer to a request sent at `sent`, when
   * the session's lockSeq was `seq` (C2 #ct2-confirm). With `held` (the
   * server confirms locks) a lock listed with its token is confirmed and a
   * lock numbered up to seq that is not listed is lost at once; without it
   * (an older server) every lock counts as confirmed. When live, the session
   * and every confirmed lock are extended to sent + remaining − margin —
   * never a lock the answer does not list.
   */
  answer(sent: number, seq: number, live: boolean, remainingMs: number, held: HeldLocks | undefined): void {
    if (this._err) return;
    const now = this.client.clock.now();
    if (live && now >= this._deadline) {
      this.end(new SessionExpiredError());
      return;
    }
    const listed = new Map<string, bigint>();
    for (const h of held?.locks ?? []) listed.set(h.key, h.token);
    const d = trustFrom(sent, now) + remainingMs - this.marginMs;
    const lost: Lock[] = [];
    for (const [key, l] of this.locks) {
      if (held === undefined || listed.get(key) === l.token) {
        if (live && d > l.ownDeadline) l.ownDeadline = d;
        continue;
      }
      if (l.seq <= seq) {
        this.locks.delete(key);
        this.fence(key, l.token);
        lost.push(l);
      }
    }
    if (live && d > this._deadline) this._deadline = d;
    // Grants that no Lock and no call under way knows: a place kept for a
    // call that gave up was handed the key (C2 #ct2-keep-place). Release them.
    const orphans: { key: string; token: bigint }[] = [];
    for (const h of held?.locks ?? []) {
      if (!this.locks.has(h.key) && !this.busy.get(h.key) && h.token > (this.lostTok.get(h.key) ?? 0n)) {
        orphans.push({ key: h.key, token: h.token });
      }
    }
    for (const l of lost) l.end(unconfirmed(l, now, "not confirmed by the server"));
    for (const o of orphans) this.releaseOrphan(o.key, o.token);
  }

  /** @internal records that grants of key up to token are gone */
  fence(key: string, token: bigint): void {
    if (token <= (this.lostTok.get(key) ?? 0n)) return;
    if (this.lostTok.size >= MAX_LOST_KEYS) this.lostTok.clear();
    this.lostTok.set(key, token);
  }

  /**
   * @internal Applies a lock-lost notice and queues its acknowledgement for
   * the stream numbered `gen` it came on (none when gen is 0: a stream the
   * client left sends nothing more). Reports whether one was queued. Tokens
   * of a key only rise, so the notice also ends an older grant of the key
   * and fences a grant reply of that token still on its way.
   */
  lockLost(n: LockLost, gen: number): boolean {
    if (this._err) return false;
    let ack = false;
    if (n.noticeId !== 0n && gen !== 0) {
      if (this.ackGen !== gen) {
        this.acks = [];
        this.ackGen = gen;
      }
      this.acks.push(n.noticeId);
      ack = true;
    }
    this.fence(n.key, n.token);
    const l = this.locks.get(n.key);
    if (!l || l.token > n.token) return ack;
    this.locks.delete(n.key);
    switch (n.reason) {
      case LockLostReason.MAX_HOLD:
        l.end(new MaxHoldError("lock lost: revoked by the server after its maximum hold"));
        break;
      case LockLostReason.REVOKED:
        l.end(new LockLostError("lock lost: revoked"));
        break;
      case LockLostReason.EXPIRED:
        l.end(new LockLostError("lock lost: expired"));
        break;
      case LockLostReason.SERVER_SHUTDOWN:
        l.end(new LockLostError("lock lost: server shutting down"));
        break;
      default:
        l.end(new LockLostError("lock lost: gone"));
    }
    return ack;
  }

  /** @internal what a heartbeat about to be sent on stream `gen` carries: lockSeq and the acks (taken). */
  beatState(gen: number): { seq: number; acks: bigint[] } {
    const acks = this.ackGen === gen ? this.acks : [];
    this.acks = []; // acks of an older stream are dropped, never sent here
    return { seq: this.lockSeq, acks };
  }

  /** @internal the session's lockSeq, for a heartbeat that carries no acknowledgements (a stalled stream's) */
  beatSeq(): number {
    return this.lockSeq;
  }

  /** @internal marks a call on key under way until the returned function is called */
  busyKey(key: string): () => void {
    this.busy.set(key, (this.busy.get(key) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const n = (this.busy.get(key) ?? 1) - 1;
      if (n <= 0) this.busy.delete(key);
      else this.busy.set(key, n);
    };
  }

  /**
   * @internal records a granted lock (addLock of the Go SDK). maxHoldAt (0:
   * none) is the Acquire's send time plus the grant's maxHoldMs (Lock.maxHoldAt);
   * a lock the session already had keeps its own.
   */
  addLock(key: string, token: bigint, deadline: number, maxHoldAt = 0): Lock {
    if (this._err) throw this._err;
    if (this._deadline > deadline) deadline = this._deadline;
    if (token <= (this.lostTok.get(key) ?? 0n)) throw new LockLostError("lock lost before its grant reply arrived");
    const have = this.locks.get(key);
    if (have && have.token === token) {
      if (deadline > have.ownDeadline) have.ownDeadline = deadline;
      return have;
    }
    this.lockSeq++;
    const l = new Lock(this, key, token, this.lockSeq, deadline, maxHoldAt);
    this.locks.set(key, l);
    if (deadline < this.timerAt) this.arm();
    return l;
  }

  private releaseOrphan(key: string, token: bigint): void {
    this.fence(key, token); // once is enough
    const c = this.client;
    c.background(async () => {
      const signal = AbortSignal.any([this.signal, c.signal, AbortSignal.timeout(c.closeTimeoutMs)]);
      await c.api.release(create(ReleaseRequestSchema, { sessionId: this.id, sessionSecret: this.secret, key, token }), { signal });
    });
  }

  /** @internal ends trust in the session and every lock in it (idempotent) and stops its heartbeats. */
  end(err: Error): void {
    if (this._err) return;
    this._err = err;
    this.timer?.cancel();
    this.ac.abort(err);
    const locks = [...this.locks.values()];
    this.locks.clear();
    for (const l of locks) l.end(err);
    this.client.ka.remove(this);
    // A locally expired session is also closed on the server, best effort,
    // so its locks are freed before the TTL.
    if (err instanceof SessionExpiredError) this.abandon();
  }

  /** @internal closes the session on the server in the background, best effort. */
  abandon(): void {
    const c = this.client;
    c.background(async () => {
      const signal = AbortSignal.any([c.signal, AbortSignal.timeout(c.closeTimeoutMs)]);
      await c.api.closeSession(create(CloseSessionRequestSchema, { sessionId: this.id, sessionSecret: this.secret }), { signal });
    });
  }

  /** @internal ends the session when the server reported it dead. */
  checkServerErr(err: unknown): void {
    if (err instanceof SessionDeadError && !(err instanceof SessionExpiredError)) this.end(err);
    if (err instanceof PermissionDeniedError && err.reason.startsWith("SESSION_")) this.end(err);
  }

  /**
   * Ends the session: its signal aborts and every lock of the session is lost
   * at once; then the session is closed on the server, releasing its locks
   * (retried until `signal` aborts). Closing a session the server already
   * reported dead resolves.
   */
  async close(opts: { signal?: AbortSignal } = {}): Promise<void> {
    this.end(new ClosedError("session closed"));
    const serverDead = this._err instanceof SessionDeadError && !(this._err instanceof SessionExpiredError);
    if (serverDead || this.closedOK) return;
    const c = this.client;
    await c.retry(opts.signal, (signal) =>
      c.api.closeSession(create(CloseSessionRequestSchema, { sessionId: this.id, sessionSecret: this.secret }), { signal }));
    this.closedOK = true;
  }
}
