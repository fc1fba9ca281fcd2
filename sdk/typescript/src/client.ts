// Client: a connection to lockd (one or several replicas), its options, the
// retry rule, and the calls that need no session (the Go SDK's client.go,
// tls.go, token.go, options.go).
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { sleep, realClock, type Clock } from "./clock.js";
import { ClosedError, InvalidArgumentError, retryable } from "./errors.js";
import {
  CheckConsistency, CheckTokenRequestSchema, CloseSessionsRequestSchema, InspectRequestSchema, ListRequestSchema, ListSessionsRequestSchema, LockMode, RevokeRequestSchema,
  type LockInfo as PbLockInfo,
} from "./gen/lockd/v1/lockd_pb.js";
import { hotKeys, type HotKeys } from "./hotkeys.js";
import { KeepAliver } from "./keepalive.js";
import { checkKey, checkPrefix, checkTiming, checkWholeMs, MAX_LIST_LIMIT } from "./limits.js";
import { GrpcApi, type LockApi } from "./rpc.js";
import { HttpApi, nodeTransport } from "./http.js";
import { Tracing, type TracerProviderLike } from "./trace.js";
import { Session, type SessionOptions } from "./session.js";
import { watch, type WatchEvent, type WatchOptions } from "./watch.js";
import { observe, type Leader } from "./election.js";

/** TLS settings: PEM contents (`ca`, `cert`, `key`) or file paths (`caFile`, `certFile`, `keyFile`). */
export interface TLSOptions {
  ca?: string | Buffer;
  cert?: string | Buffer;
  key?: string | Buffer;
  caFile?: string;
  certFile?: string;
  keyFile?: string;
  /** The name to verify in the server's certificate when it is not the target's host. */
  serverName?: string;
}

/** Options of {@link Client}. Durations are whole milliseconds. */
export interface ClientOptions {
  /** Several replicas of one backend (instead of a comma-separated target). */
  addresses?: string[];
  /** Connect over TLS (mutual TLS with `cert` and `key`). Without it, plaintext is allowed only to loopback targets. */
  tls?: TLSOptions | true;
  /** Allow plaintext to a target that is not on loopback (anyone on the path can read the traffic). */
  insecure?: boolean;
  /** A bearer token sent with every call (C5 #ct5-auth); over TLS, or plaintext to loopback only. */
  token?: string;
  /** A file holding the bearer token (surrounding whitespace trimmed). */
  tokenFile?: string;
  /** TTL of the client's sessions; default the server's lock.session.ttl. */
  ttlMs?: number;
  /** Overrides the server's safety margin: 0 < margin < TTL/2. */
  safetyMarginMs?: number;
  /** Overrides the server's heartbeat interval: 100 ms ≤ interval ≤ TTL − 2×margin. */
  heartbeatIntervalMs?: number;
  /** Backoff bounds between retries (default 50 ms and 2 s). */
  backoffMinMs?: number;
  backoffMaxMs?: number;
  /** Bounds the best-effort close calls (default 2 s). */
  closeTimeoutMs?: number;
  /** The clock of every deadline (tests). */
  clock?: Clock;
  /** Receives the SDK's debug messages (default: none). */
  logger?: (msg: string, detail?: unknown) => void;
  /**
   * Reach lockd through its HTTP/JSON API (C2 #ct2-http; the addresses are
   * `lock.server.http.listen`'s) instead of gRPC: for a path that carries
   * HTTP/1.1 only. Sessions are kept alive by the `Heartbeat` route, one call
   * per heartbeat, on the gRPC path's schedule and deadline rules.
   */
  http?: boolean;
  /**
   * Your OpenTelemetry TracerProvider (`@opentelemetry/api`'s; typed
   * structurally, the SDK imports no OpenTelemetry package): every unary gRPC
   * call attempt becomes a client span `lockd.v1.LockService/<Method>`, the
   * child of your active span, and sends its W3C trace context to lockd (C4
   * #ct4-traces). Not with `http: true`, which records no span.
   */
  tracerProvider?: TracerProviderLike;
  /** @internal a LockApi to use instead of gRPC (tests) */
  api?: LockApi;
}

/** A holder of a semaphore or read/write key. */
export interface HolderInfo {
  session: string;
  token: bigint;
  acquiredAt?: Date;
  /** "shared" or "exclusive" for a read/write lock, "" for a semaphore slot. */
  mode: "" | "shared" | "exclusive";
  owner: string;
  labels: Record<string, string>;
  value: Uint8Array;
}

/** What {@link Client.checkToken} answers (C2 #ct2-check-token). */
export interface TokenCheck {
  /** A grant of the key with the checked token is held. */
  current: boolean;
  /** The key's current grants' tokens, lowest first; empty when nobody holds it. */
  tokens: bigint[];
  /** The server's index answered, not the backend. */
  cached: boolean;
}

/** What {@link Client.inspect} and {@link Client.list} say about a key. */
export interface LockInfo {
  key: string;
  held: boolean;
  session: string;
  token: bigint;
  acquiredAt?: Date;
  waiters: string[];
  owner: string;
  labels: Record<string, string>;
  value: Uint8Array;
  holders: HolderInfo[];
  /** The semaphore's N (1 for a read/write lock); 0 for a plain lock. */
  limit: number;
  lockDelayMs: number;
  /** Set when nobody holds the key but a lock-delay still keeps it from being granted. */
  delayRemainingMs: number;
  /** Inspect only: each waiter's estimated wait, in queue order; empty when the server knows none (C2 #ct2-wait-estimate). */
  waitEstimates: WaitEstimate[];
}

/** One waiter's estimated wait: position 1 is next in line; waitMs about how long from the answer until its grant. Never a promise. */
export interface WaitEstimate {
  session: string;
  position: number;
  waitMs: number;
}

function lockInfo(p: PbLockInfo | undefined, held: boolean, key: string): LockInfo {
  const ts = (t?: { seconds: bigint; nanos: number }) => (t ? new Date(Number(t.seconds) * 1000 + t.nanos / 1e6) : undefined);
  return {
    key: p?.key || key, held, session: p?.sessionId ?? "", token: p?.token ?? 0n, acquiredAt: ts(p?.acquiredAt),
    waiters: p?.waiters ?? [], owner: p?.owner ?? "", labels: p?.labels ?? {}, value: p?.value ?? new Uint8Array(),
    holders: (p?.holders ?? []).map((h) => ({
      session: h.sessionId, token: h.token, acquiredAt: ts(h.acquiredAt),
      mode: h.mode === LockMode.SHARED ? "shared" : h.mode === LockMode.EXCLUSIVE ? "exclusive" : "",
      owner: h.owner, labels: h.labels, value: h.value,
    })),
    limit: p?.limit ?? 0, lockDelayMs: Number(p?.lockDelayMs ?? 0n), delayRemainingMs: Number(p?.delayRemainingMs ?? 0n),
    waitEstimates: (p?.waitEstimates ?? []).map((e) => ({ session: e.sessionId, position: e.position, waitMs: Number(e.estimateMs) })),
  };
}

function hostOf(addr: string): string {
  const m = /^\[(.*)\](?::\d+)?$/.exec(addr);
  if (m) return m[1]!;
  const i = addr.lastIndexOf(":");
  return i < 0 ? addr : addr.slice(0, i);
}

function loopback(addr: string): boolean {
  const h = hostOf(addr);
  if (h === "localhost" || h === "::1") return true;
  return isIP(h) === 4 && h.startsWith("127.");
}

/** Splits a target into host:port addresses, checking each. */
function splitTarget(target: string, addresses?: string[]): string[] {
  const list = addresses && addresses.length > 0 ? addresses : target.split(",");
  return list.map((a) => {
    const t = a.trim();
    if (!/^(\[[^\]]+\]|[^:/\s]+):\d+$/.test(t)) throw new InvalidArgumentError(`address ${JSON.stringify(t)}: want host:port`);
    return t;
  });
}

function pem(v: string | Buffer | undefined, file: string | undefined): Buffer | null {
  if (v !== undefined) return Buffer.isBuffer(v) ? v : Buffer.from(v);
  if (file) return readFileSync(file);
  return null;
}

/**
 * A client of lockd: one replica ("host:port") or several ("a:7420,b:7420",
 * or `addresses`), between which it moves when one dies, drains or stalls,
 * keeping its sessions, locks and queue places (C2 #ct2-failover). All
 * sessions of a client share one KeepAlive stream. Call {@link close} when
 * done: an open session keeps Node's event loop busy.
 */
export class Client {
  /** @internal */ readonly api: LockApi;
  /** @internal */ readonly clock: Clock;
  /** @internal */ readonly opts: ClientOptions;
  /** @internal */ readonly ka: KeepAliver;
  /** @internal */ readonly closeTimeoutMs: number;
  private readonly ac = new AbortController();
  private readonly tasks = new Set<Promise<unknown>>();
  private readonly backoffMin: number;
  private readonly backoffMax: number;

  constructor(target: string, opts: ClientOptions = {}) {
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
    this.backoffMin = opts.backoffMinMs ?? 50;
    this.backoffMax = opts.backoffMaxMs ?? 2000;
    this.closeTimeoutMs = opts.closeTimeoutMs ?? 2000;
    if (!(this.backoffMin > 0 && this.backoffMax >= this.backoffMin)) {
      throw new InvalidArgumentError("backoff bounds must satisfy 0 < min <= max");
    }
    for (const [f, v] of [["ttl", opts.ttlMs], ["safety_margin", opts.safetyMarginMs], ["heartbeat_interval", opts.heartbeatIntervalMs]] as const) {
      if (v !== undefined) checkWholeMs(f, v);
    }
    checkTiming(opts.ttlMs ?? 0, opts.safetyMarginMs ?? 0, opts.heartbeatIntervalMs ?? 0);
    this.api = opts.api ?? this.dial(target, opts);
    this.ka = new KeepAliver(this);
  }

  private dial(target: string, opts: ClientOptions): LockApi {
    const addrs = splitTarget(target, opts.addresses);
    const allLoopback = addrs.every(loopback);
    if (opts.tls && opts.insecure) throw new InvalidArgumentError("give one of tls and insecure");
    let creds: grpc.ChannelCredentials;
    let serverName: string | undefined;
    if (opts.tls) {
      const t = opts.tls === true ? {} : opts.tls;
      creds = grpc.credentials.createSsl(pem(t.ca, t.caFile), pem(t.key, t.keyFile), pem(t.cert, t.certFile));
      serverName = t.serverName;
    } else if (opts.insecure || allLoopback) {
      creds = grpc.credentials.createInsecure();
    } else {
      throw new InvalidArgumentError(`${addrs.join(",")} is not on loopback: give tls (or insecure to send plaintext anyway)`);
    }
    if (opts.token !== undefined && opts.tokenFile !== undefined) throw new InvalidArgumentError("give one of token and tokenFile");
    let token = opts.token;
    if (opts.tokenFile !== undefined) token = readFileSync(opts.tokenFile, "utf8").trim();
    if (token !== undefined) {
      if (token === "" || /[\s\u0000-\u001f]/.test(token)) throw new InvalidArgumentError("bearer token is empty or has spaces or control characters");
      if (!opts.tls && !allLoopback) throw new InvalidArgumentError("a bearer token is sent over TLS only (or plaintext to loopback)");
    }
    const header = token === undefined ? undefined : `Bearer ${token}`;
    if (opts.http) {
      const t = opts.tls === true ? {} : opts.tls;
      const transport = nodeTransport({
        authorization: header,
        tls: t && { ca: pem(t.ca, t.caFile), cert: pem(t.cert, t.certFile), key: pem(t.key, t.keyFile), serverName: t.serverName },
      });
      return new HttpApi({ addresses: addrs, transport, now: () => this.clock.now() });
    }
    return new GrpcApi({
      addresses: addrs, credentials: creds, serverName, now: () => this.clock.now(),
      backoffMinMs: this.backoffMin, backoffMaxMs: this.backoffMax,
      tracing: opts.tracerProvider === undefined ? undefined : new Tracing(opts.tracerProvider),
      metadata: header === undefined ? undefined : () => {
        const md = new grpc.Metadata();
        md.set("authorization", header);
        return md;
      },
    });
  }

  /** Aborts when the client closes. */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  /** @internal */
  debug(msg: string, detail?: unknown): void {
    this.opts.logger?.(msg, detail);
  }

  /** @internal the wait before retry number attempt (0-based), with jitter */
  backoff(attempt: number): number {
    let d = this.backoffMin * 2 ** Math.min(attempt, 16);
    if (d > this.backoffMax) d = this.backoffMax;
    return d / 2 + Math.random() * (d / 2);
  }

  /**
   * @internal Calls f until it succeeds, fails with an error that is not
   * retryable, or signal aborts (then it rejects with the signal's reason).
   */
  async retry<T>(signal: AbortSignal | undefined, f: (signal: AbortSignal) => Promise<T>, both?: AbortSignal): Promise<T> {
    // both: a signal that already aborts with signal or the client (a session's callSignal), kept from call to call
    // instead of a new AbortSignal.any per call (the hot path's acquire; issue 25 SDK-TS CPU).
    const sig = both ?? (signal ? AbortSignal.any([signal, this.ac.signal]) : this.ac.signal);
    for (let attempt = 0; ; attempt++) {
      if (this.ac.signal.aborted) throw new ClosedError("client closed");
      if (signal?.aborted) throw signal.reason;
      try {
        return await f(sig);
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        if (this.ac.signal.aborted) throw new ClosedError("client closed");
        if (!retryable(e)) throw e;
        this.debug("retrying", e);
      }
      await sleep(this.clock, this.backoff(attempt), sig);
    }
  }

  /** @internal runs f in the background, best effort; close waits for it. */
  background(f: () => Promise<unknown>): void {
    this.track(f().catch((e) => this.debug("background call failed", e)));
  }

  /** @internal */
  track(p: Promise<unknown>): void {
    this.tasks.add(p);
    const done = () => void this.tasks.delete(p);
    p.then(done, done);
  }

  /**
   * Opens a session. Its TTL is `ttlMs`, else the client's, else the
   * server's. Retryable errors are retried until `signal` aborts. A margin or
   * heartbeat interval the TTL cannot carry is refused (InvalidArgumentError).
   */
  newSession(opts: SessionOptions = {}): Promise<Session> {
    if (this.ac.signal.aborted) return Promise.reject(new ClosedError("client closed"));
    return Session.open(this, opts);
  }

  /** Describes key: its holder, token and waiters. */
  async inspect(key: string, opts: { signal?: AbortSignal } = {}): Promise<LockInfo> {
    checkKey(key);
    const r = await this.retry(opts.signal, (signal) => this.api.inspect(create(InspectRequestSchema, { key }), { signal }));
    return lockInfo(r.lock, r.held, key);
  }

  /**
   * Whether (key, token) is a current grant of key: Chubby's CheckSequencer,
   * for a resource handed a fencing token (C2 #ct2-check-token). A key nobody
   * holds is not current. By default the server reads the backend; `cached`
   * answers from its watch-fed index, at most one watch delivery delay
   * behind. Needs read access to the key, like inspect.
   */
  async checkToken(key: string, token: bigint, opts: { cached?: boolean; signal?: AbortSignal } = {}): Promise<TokenCheck> {
    checkKey(key);
    if (typeof token !== "bigint" || token <= 0n || token >= 1n << 64n) {
      throw new InvalidArgumentError("token: want a fencing token (1 to 2^64-1)", "token");
    }
    const consistency = opts.cached ? CheckConsistency.CACHED : CheckConsistency.LINEARIZABLE;
    const r = await this.retry(opts.signal, (signal) =>
      this.api.checkToken(create(CheckTokenRequestSchema, { key, token, consistency }), { signal }));
    return { current: r.current, tokens: [...r.tokens], cached: r.cached };
  }

  /** One page of the held keys that start with prefix, in key order, and the next page's token ("" after the last). */
  async list(prefix: string, opts: { pageToken?: string; limit?: number; signal?: AbortSignal } = {}): Promise<{ locks: LockInfo[]; nextPageToken: string }> {
    checkPrefix(prefix);
    const limit = Math.min(Math.max(opts.limit ?? 0, -1), MAX_LIST_LIMIT + 1);
    const r = await this.retry(opts.signal, (signal) =>
      this.api.list(create(ListRequestSchema, { prefix, pageToken: opts.pageToken ?? "", limit }), { signal }));
    return { locks: r.locks.map((l) => lockInfo(l, true, l.key)), nextPageToken: r.nextPageToken };
  }

  /**
   * Which keys under prefix the lockd process this client is connected to
   * saw waited for and held most over its recent window (30 to 60 s), at most
   * `limit` per ranking (0: 10; at most 50); see {@link HotKeys} (C2
   * #ct2-hotkeys). Keys the caller may not read are left out; other replicas
   * keep their own: ask each.
   */
  hotKeys(prefix = "", opts: { limit?: number; signal?: AbortSignal } = {}): Promise<HotKeys> {
    return hotKeys(this, prefix, opts);
  }

  /** Administrative: deletes key's grant whoever holds it (C2 #ct2-spi Revoke). */
  async revoke(key: string, opts: { signal?: AbortSignal } = {}): Promise<{ revoked: boolean; session: string; token: bigint }> {
    checkKey(key);
    const r = await this.retry(opts.signal, (signal) => this.api.revoke(create(RevokeRequestSchema, { key }), { signal }));
    return { revoked: r.revoked, session: r.sessionId, token: r.token };
  }

  /**
   * Administrative: closes every live session bound to principal, as each
   * session's own close would (its locks released, its client told at its
   * next heartbeat); needs admin on every key (C2 #ct2-close-sessions).
   * Returns how many sessions it closed and how many locks they released.
   * Retrying after an error is safe: what was closed stays closed.
   */
  async closeSessions(principal: string, opts: { signal?: AbortSignal } = {}): Promise<{ closed: number; released: number }> {
    const r = await this.retry(opts.signal, (signal) =>
      this.api.closeSessions(create(CloseSessionsRequestSchema, { principal }), { signal }));
    return { closed: Number(r.closed), released: Number(r.released) };
  }

  /** One page of the live sessions (C2 #ct2-list-sessions). */
  async listSessions(opts: { principal?: string; pageToken?: string; limit?: number; signal?: AbortSignal } = {}) {
    const r = await this.retry(opts.signal, (signal) =>
      this.api.listSessions(create(ListSessionsRequestSchema, { principal: opts.principal ?? "", pageToken: opts.pageToken ?? "", limit: opts.limit ?? 0 }), { signal }));
    return {
      sessions: r.sessions.map((s) => ({
        id: s.sessionId, principal: s.principal, owner: s.owner, labels: s.labels,
        ttlMs: Number(s.ttlMs), remainingMs: Number(s.remainingMs), locks: Number(s.locks),
      })),
      nextPageToken: r.nextPageToken,
    };
  }

  /**
   * Watches the keys with `prefix`. Resolves once the watch is established
   * (every change committed afterwards is delivered) to an async iterable of
   * events in commit order, re-opened through any replica from the last
   * cursor when the stream breaks (C2 #ct2-watch-resume). Ends when `signal`
   * aborts.
   */
  watch(prefix: string, opts: WatchOptions = {}): Promise<AsyncIterable<WatchEvent>> {
    return watch(this, prefix, opts);
  }

  /** Follows the election `name`: the current leader, or null for "no leader" (C2 #ct2-election). */
  observe(name: string, opts: { signal?: AbortSignal } = {}): AsyncIterable<Leader | null> {
    return observe(this, name, opts);
  }

  /**
   * Ends every session of the client (their signals abort and their locks
   * are released on the server, best effort within closeTimeoutMs), stops the
   * heartbeats and closes the connections.
   */
  async close(): Promise<void> {
    if (this.ac.signal.aborted) return;
    const sessions = this.ka.sessions();
    await Promise.allSettled(sessions.map((s) => s.close({ signal: AbortSignal.timeout(this.closeTimeoutMs) })));
    this.ac.abort(new ClosedError("client closed"));
    this.ka.close();
    await Promise.allSettled([...this.tasks]);
    this.api.close();
  }
}
