// A chaos worker on the TypeScript SDK: the client process of lockd's chaos
// suite (test/chaos), speaking exactly the protocol of the Go worker
// (test/chaos/worker, package doc; test/chaos/cmd/chaos-worker for the flags)
// and of the Python one (sdk/python lockd._chaosworker), so that the runner
// can start it instead of the Go one (runner.Spec.SDK = TypeScriptSDK). Its
// entry is chaosworker.ts: run `node dist/test/chaosworker.js -proc w0 -lockd
// ADDR ...`; the run's epoch comes from LOCKD_CHAOS_EPOCH (Unix nanoseconds).
// Not part of the npm package; not for use by hand.
//
// The loop, the state lines on stdout (`wait KEY SESSION`, `hold KEY TOKEN 1
// MODE REPLICA`, `free KEY`), the -hold-ack handshake (one line read from
// stdin after a hold line and the hold, before the grant's second write), the
// writes to the fenced resource (POST /write, which refuses a token below the
// highest it saw), the history file (JSON lines: start, invoke, complete, op)
// and the trust rules (`sdk`: until the lock's signal aborts, or its deadline
// passed before the release; `receive-ttl` and `ignore-done`: the controls)
// are the Go worker's. Like it, the worker writes regardless of trust: late
// writes model a holder paused between checking its lock and writing, which
// the fenced resource must refuse and the trusted-overlap checker must find
// when the trust rule is broken (LOCKD_TSSDK_CONTROL=recvtime breaks the
// SDK's send-time rule, src/session.ts trustFrom).
//
// REPLICA is the address the SDK's calls go to after the grant, where the Go
// worker names the peer of its latest successful call; they differ only if
// the client moved in between.
//
// SIGTERM or SIGINT stops the worker: it finishes the current grant (release
// included), closes its session and exits 0; a failure to record exits 1.
import { closeSync, constants, openSync, writeSync } from "node:fs";
import * as http from "node:http";
import { createInterface } from "node:readline";
import { sleep as sleepOn, realClock, type Clock } from "../src/clock.js";
import { Client, InvalidArgumentError, LimitMismatchError, Lock, LockdError, NotOwnerError, ReleasedError, Session } from "../src/index.js";
import { GrpcApi } from "../src/rpc.js";

export const EPOCH_ENV = "LOCKD_CHAOS_EPOCH";
const TRUST_SDK = "sdk", TRUST_RECEIVE_TTL = "receive-ttl", TRUST_IGNORE_DONE = "ignore-done";
const EXCLUSIVE_SHARE = 0.4; // worker.ExclusiveShare
const WRITE_TIMEOUT_MS = 5000;
const RELEASE_TIMEOUT_MS = 5000;
const OPEN_TIMEOUT_MS = 5000;
const RETRY_PAUSE_MS = 50;

const UNITS: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, "μs": 1e-3, ms: 1, s: 1e3, m: 60e3, h: 3600e3 };

/** A Go time.Duration string ("0s", "80ms", "1m30s") in milliseconds. */
export function parseDuration(s: string): number {
  if (s === "0" || s === "+0" || s === "-0") return 0;
  const neg = s.startsWith("-");
  const rest = s.replace(/^[-+]/, "");
  const part = /(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)/y;
  let pos = 0, ms = 0;
  while (pos < rest.length) {
    part.lastIndex = pos;
    const m = part.exec(rest);
    if (!m) throw new Error(`invalid duration "${s}"`);
    ms += Number(m[1]) * UNITS[m[2]!]!;
    pos = part.lastIndex;
  }
  if (rest === "") throw new Error(`invalid duration "${s}"`);
  return neg ? -ms : ms;
}

/**
 * history.Clock: nanoseconds since the run's epoch, read from the monotonic
 * clock (performance.now) after one reading of the wall clock (wallAt). Not
 * from performance.timeOrigin: timeOrigin + now() can be far from the wall
 * clock in a Node process started on a loaded machine (58 ms in 1 of 36
 * processes started beside CPU burners), which made one worker's history
 * late against every other process's (trusted overlaps of 59–85 ms in
 * ts-replica-kill-etcd, all of one worker, whose writes the fenced resource
 * had ordered the other way).
 */
export class HistoryClock {
  private readonly startMono: number;
  private readonly offset: number; // ns since the epoch at startMono

  constructor(readonly epoch: bigint, wallMs: () => number = Date.now, mono: () => number = () => performance.now()) {
    const [wallNs, at] = wallAt(wallMs, mono);
    this.startMono = at;
    this.offset = Number(wallNs - epoch);
  }

  now(): number {
    return this.at(performance.now());
  }

  /** The history time of a performance.now() reading (ms). */
  at(mono: number): number {
    return Math.round(this.offset + (mono - this.startMono) * 1e6);
  }
}

/**
 * The wall clock in ns at a monotonic reading (ms): Date.now() counts whole
 * milliseconds, so it is read until it ticks — at the tick the wall clock is
 * exactly the new millisecond, and the tick lies between the monotonic
 * readings around the Date.now() calls that saw the old and the new value.
 * Of five ticks the one with the narrowest such window is taken (a window
 * widened by a preemption is not).
 */
export function wallAt(wallMs: () => number, mono: () => number): [bigint, number] {
  let best: [bigint, number] | undefined;
  let bestWidth = Infinity;
  for (let i = 0; i < 5; i++) {
    const old = wallMs();
    let before = mono();
    for (let n = 0; ; n++) {
      const m = wallMs();
      const after = mono();
      if (m !== old) {
        if (after - before < bestWidth) {
          bestWidth = after - before;
          best = [BigInt(m) * 1_000_000n, (before + after) / 2];
        }
        break;
      }
      if (n > 1e7) throw new Error("the wall clock does not advance");
      before = after;
    }
  }
  return best!;
}

type Call = { seq: number; kind: string; key: string };

/**
 * history.Recorder: one JSON line per event, each one write(2) to a file
 * opened O_APPEND|O_EXCL, so a SIGKILL leaves whole lines only.
 */
export class Recorder {
  private fd: number;
  private seq = 0;
  err?: string;

  constructor(path: string, readonly proc: string, readonly clock: HistoryClock) {
    this.fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_APPEND, 0o644);
    // The epoch is an int64 of nanoseconds: written as its exact digits.
    this.write(JSON.stringify({ ev: "start", proc, seq: 0, kind: "", invoke: clock.now(), complete: 0, outcome: "", epoch: 0 })
      .replace(/"epoch":0}$/, `"epoch":${clock.epoch}}`));
  }

  private write(line: string): void {
    if (this.err !== undefined) return;
    if (this.fd < 0) {
      this.err = "history: write after close";
      return;
    }
    const b = Buffer.from(line + "\n");
    try {
      if (writeSync(this.fd, b) !== b.length) this.err = "history: write line: short write";
    } catch (e) {
      this.err = `history: write line: ${(e as Error).message}`;
    }
  }

  invoke(kind: string, key: string, token = 0n, mode = ""): Call {
    this.seq++;
    const line: Record<string, unknown> = { ev: "invoke", proc: this.proc, seq: this.seq, kind, key, invoke: this.clock.now(), complete: 0, outcome: "" };
    if (token) line["token"] = Number(token);
    if (mode) line["mode"] = mode;
    this.write(JSON.stringify(line));
    return { seq: this.seq, kind, key };
  }

  complete(call: Call, outcome: string, token = 0n, err = ""): void {
    const line: Record<string, unknown> = { ev: "complete", proc: this.proc, seq: call.seq, kind: call.kind, key: call.key, invoke: 0, complete: this.clock.now(), outcome };
    if (token) line["token"] = Number(token);
    if (err) line["err"] = err;
    this.write(JSON.stringify(line));
  }

  /** A lost op: trust in (key, token) ended at `at` (or now, if earlier). */
  lost(key: string, token: bigint, at: number, why: string): void {
    const now = this.clock.now();
    this.seq++;
    this.write(JSON.stringify({ ev: "op", proc: this.proc, seq: this.seq, kind: "lost", key, token: Number(token), invoke: Math.min(now, at), complete: now, outcome: "ok", err: why }));
  }

  close(): string | undefined {
    if (this.fd >= 0) {
      try {
        closeSync(this.fd);
      } catch (e) {
        this.err ??= `history: close recorder: ${(e as Error).message}`;
      }
      this.fd = -1;
    }
    return this.err;
  }
}

/**
 * An SDK clock running `scale` times as fast as the real one (the Go worker's
 * scaledClock): readings and timers are converted.
 */
export class ScaledClock implements Clock {
  private readonly base = performance.now();
  constructor(private readonly scale: number) {}

  now(): number {
    return this.base + (performance.now() - this.base) * this.scale;
  }

  setTimer(ms: number, f: () => void) {
    return realClock.setTimer(ms / this.scale, f);
  }

  /** The performance.now() reading at which this clock reads t. */
  real(t: number): number {
    return this.base + (t - this.base) / this.scale;
  }
}

/** The fenced resource's client (package fenced): POST /write. */
class Fenced {
  private readonly url: URL;
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

  constructor(base: string) {
    this.url = new URL(base.replace(/\/+$/, "") + "/write");
  }

  /** [outcome, error text]: ok; fail for a stale token or a bad request (definite refusals); unknown for anything else. */
  write(key: string, writer: string, mode: string, token: bigint): Promise<[string, string]> {
    const body: Record<string, unknown> = { key, writer, token: Number(token) };
    if (mode) body["mode"] = mode;
    const data = JSON.stringify(body);
    return new Promise((resolve) => {
      const req = http.request(this.url, {
        method: "POST", agent: this.agent, timeout: WRITE_TIMEOUT_MS,
        headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) },
      }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", (e) => resolve(["unknown", `fenced: write: ${e.message}`]));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          const status = res.statusCode ?? 0;
          if (status === 200 || status === 409) {
            let rep: { highest?: number };
            try {
              rep = JSON.parse(text || "{}");
            } catch (e) {
              resolve(["unknown", `fenced: write: decode reply: ${(e as Error).message}`]);
              return;
            }
            if (status === 409) {
              resolve(["fail", `fenced: write "${key}" token ${token} (highest ${rep.highest ?? 0}): fenced: stale token`]);
              return;
            }
            resolve(["ok", ""]);
            return;
          }
          if (status === 400) {
            resolve(["fail", `fenced: write: ${text.slice(0, 512).trim()}: fenced: bad request`]);
            return;
          }
          resolve(["unknown", `fenced: write: unexpected status ${status} ${res.statusMessage ?? ""}`]);
        });
      });
      req.on("timeout", () => req.destroy(new Error("timeout")));
      req.on("error", (e) => resolve(["unknown", `fenced: write: ${e.message}`]));
      req.end(data);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

/** At most one lost op per grant (the signal and the release path may both see the end of trust). */
class LostOnce {
  private done = false;
  constructor(private readonly rec: Recorder) {}

  record(key: string, token: bigint, at: number, why: string): void {
    if (this.done) return;
    this.done = true;
    this.rec.lost(key, token, at, why);
  }
}

function say(line: string): void {
  writeSync(1, line + "\n");
}

/** The worker's settings: the Go worker's flags. Durations in ms. */
export interface Config {
  proc: string;
  lockd: string[];
  fenced: string;
  history: string;
  keys: string[];
  ttl: number;
  holdMin: number;
  holdMax: number;
  clockScale: number;
  trust: string;
  limit: number;
  rw: boolean;
  heartbeatInterval: number;
  seed: number;
  holdAck: boolean;
}

/** The Go worker's flags (-name value, -name=value; -hold-ack and -rw alone are true). */
export function parseArgs(argv: string[]): Config {
  const f: Record<string, string> = {
    proc: "", lockd: "", fenced: "", history: "", keys: "", ttl: "0s", "hold-min": "0s", "hold-max": "0s",
    "clock-scale": "1", trust: TRUST_SDK, limit: "0", rw: "false", "heartbeat-interval": "0s", seed: "1", "hold-ack": "false",
    pairs: "false",
  };
  const booleans = new Set(["rw", "hold-ack", "pairs"]);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith("-") || a === "-" || a === "--") throw new Error(`unexpected argument "${a}"`);
    const body = a.replace(/^--?/, "");
    const eq = body.indexOf("=");
    const name = eq < 0 ? body : body.slice(0, eq);
    if (!(name in f)) throw new Error(`flag provided but not defined: -${name}`);
    let val: string;
    if (eq >= 0) val = body.slice(eq + 1);
    else if (booleans.has(name)) val = "true";
    else {
      if (++i >= argv.length) throw new Error(`flag needs an argument: -${name}`);
      val = argv[i]!;
    }
    f[name] = val;
  }
  const bool = (name: string) => {
    const v = f[name]!.toLowerCase();
    if (!["true", "false", "1", "0", "t", "f"].includes(v)) throw new Error(`-${name}=${f[name]}: not a boolean`);
    return v === "true" || v === "1" || v === "t";
  };
  const int = (name: string) => {
    if (!/^[-+]?\d+$/.test(f[name]!)) throw new Error(`-${name}=${f[name]}: not an integer`);
    return Number(f[name]);
  };
  const list = (s: string) => s.split(",").map((x) => x.trim()).filter((x) => x !== "");
  const cfg: Config = {
    proc: f["proc"]!, fenced: f["fenced"]!, history: f["history"]!, trust: f["trust"]!, lockd: list(f["lockd"]!), keys: list(f["keys"]!),
    ttl: parseDuration(f["ttl"]!), holdMin: parseDuration(f["hold-min"]!), holdMax: parseDuration(f["hold-max"]!),
    clockScale: Number(f["clock-scale"]), limit: int("limit"), rw: bool("rw"), holdAck: bool("hold-ack"),
    heartbeatInterval: parseDuration(f["heartbeat-interval"]!), seed: int("seed"),
  };
  const problems: string[] = [];
  if (!cfg.proc) problems.push("proc is required");
  if (cfg.lockd.length === 0) problems.push("at least one lockd address is required");
  if (!cfg.fenced || !cfg.history) problems.push("fenced url and history path are required");
  if (cfg.keys.length === 0) problems.push("at least one key is required");
  if (cfg.holdMin < 0 || cfg.holdMax < cfg.holdMin) problems.push(`hold bounds ${f["hold-min"]}..${f["hold-max"]}: want 0 <= min <= max`);
  if (!(cfg.clockScale >= 0)) problems.push(`clock scale ${f["clock-scale"]} is negative or not a number`);
  if (![TRUST_SDK, TRUST_RECEIVE_TTL, TRUST_IGNORE_DONE].includes(cfg.trust)) problems.push(`trust "${cfg.trust}": want sdk, receive-ttl or ignore-done`);
  if (cfg.limit < 0 || cfg.limit > 1024) problems.push(`limit ${cfg.limit}: want 0..1024`);
  if (cfg.rw && cfg.limit > 1) problems.push(`limit ${cfg.limit} with rw: a key is a semaphore or a read/write lock`);
  // The runner passes -pairs=false to every worker (issue 26).
  if (bool("pairs")) problems.push("pairs: pair workers (the deadlock scenarios) are the Go worker's only");
  if (problems.length > 0) throw new Error("config: " + problems.join("; "));
  return cfg;
}

/** A small seeded generator (mulberry32): the worker's choices repeat with its seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Lines read from stdin, one at a time (the -hold-ack answers); undefined at EOF. */
class Lines {
  private readonly queue: string[] = [];
  private waiting?: (l: string | undefined) => void;
  private eof = false;

  constructor() {
    const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
    rl.on("line", (l) => {
      if (this.waiting) {
        const w = this.waiting;
        this.waiting = undefined;
        w(l);
      } else this.queue.push(l);
    });
    rl.on("close", () => {
      this.eof = true;
      this.waiting?.(undefined);
      this.waiting = undefined;
    });
  }

  next(): Promise<string | undefined> {
    if (this.queue.length > 0) return Promise.resolve(this.queue.shift());
    if (this.eof) return Promise.resolve(undefined);
    return new Promise((resolve) => (this.waiting = resolve));
  }
}

class Worker {
  private readonly rand: () => number;
  private readonly fc: Fenced;
  private readonly clock?: ScaledClock;
  private readonly c: Client;
  private sess?: Session;
  private next = "";
  private readonly lines?: Lines;

  constructor(private readonly cfg: Config, private readonly rec: Recorder, readonly stop: AbortController) {
    this.rand = rng(cfg.seed);
    this.fc = new Fenced(cfg.fenced);
    this.clock = cfg.clockScale !== 0 && cfg.clockScale !== 1 ? new ScaledClock(cfg.clockScale) : undefined;
    this.c = new Client(cfg.lockd.join(","), {
      addresses: cfg.lockd, backoffMinMs: 20, backoffMaxMs: 500, clock: this.clock,
      heartbeatIntervalMs: cfg.heartbeatInterval > 0 ? Math.round(cfg.heartbeatInterval) : undefined,
    });
    if (cfg.holdAck) this.lines = new Lines();
  }

  /** The history time of a reading of the SDK's clock. */
  private real(t: number): number {
    return this.rec.clock.at(this.clock ? this.clock.real(t) : t);
  }

  private async dropSession(): Promise<void> {
    const s = this.sess;
    this.sess = undefined;
    // Best effort: an expired one is abandoned by the SDK anyway.
    if (s) await s.close({ signal: AbortSignal.timeout(1000) }).catch(() => undefined);
  }

  private async session(key: string): Promise<Session | undefined> {
    if (this.sess && this.sess.err === undefined) return this.sess;
    await this.dropSession();
    const call = this.rec.invoke("open", key);
    try {
      this.sess = await this.c.newSession({ ttlMs: this.cfg.ttl > 0 ? Math.round(this.cfg.ttl) : undefined, signal: AbortSignal.any([AbortSignal.timeout(OPEN_TIMEOUT_MS), this.stop.signal]) });
    } catch (e) {
      this.rec.complete(call, "unknown", 0n, errText(e)); // the server may have made a session nobody uses
      await sleepOn(realClock, RETRY_PAUSE_MS, this.stop.signal);
      return undefined;
    }
    this.rec.complete(call, "ok");
    return this.sess;
  }

  private grantMode(): [string, { limit?: number; mode?: "shared" | "exclusive" }] {
    if (this.cfg.limit > 1) return ["slot", { limit: this.cfg.limit }];
    if (this.cfg.rw && this.rand() < EXCLUSIVE_SHARE) return ["exclusive", { mode: "exclusive" }];
    if (this.cfg.rw) return ["shared", { mode: "shared" }];
    return ["", {}];
  }

  private async write(key: string, mode: string, token: bigint): Promise<void> {
    const call = this.rec.invoke("write", key, token, mode);
    const [outcome, err] = await this.fc.write(key, this.cfg.proc, mode, token);
    this.rec.complete(call, outcome, 0n, err);
  }

  private async iteration(): Promise<void> {
    const cfg = this.cfg;
    if (!this.next) this.next = cfg.keys[Math.floor(this.rand() * cfg.keys.length)]!;
    const key = this.next;
    const sess = await this.session(key);
    if (!sess) return;
    this.next = "";
    const [mode, opts] = this.grantMode();
    say(`wait ${key} ${sess.id}`);
    let call = this.rec.invoke("acquire", key, 0n, mode);
    let lock: Lock;
    try {
      lock = await sess.acquire(key, { ...opts, signal: this.stop.signal });
    } catch (e) {
      const definite = e instanceof InvalidArgumentError || e instanceof LimitMismatchError;
      this.rec.complete(call, definite ? "fail" : "unknown", 0n, errText(e));
      say(`free ${key}`);
      await sleepOn(realClock, RETRY_PAUSE_MS, this.stop.signal);
      return;
    }
    const recv = performance.now();
    const tok = lock.token;
    this.rec.complete(call, "ok", tok);

    const lost = new LostOnce(this.rec);
    if (cfg.trust === TRUST_SDK) {
      const onLost = () => {
        if (!(lock.err instanceof ReleasedError)) lost.record(key, tok, this.real(lock.deadline), `lost set: ${errText(lock.err)}`);
      };
      if (lock.signal.aborted) onLost();
      else lock.signal.addEventListener("abort", onLost, { once: true });
    }

    await this.write(key, mode, tok);
    let hold = cfg.holdMin;
    if (cfg.holdMax > cfg.holdMin) hold += this.rand() * (cfg.holdMax - cfg.holdMin);
    let addr = "-";
    if (this.c.api instanceof GrpcApi) addr = this.c.api.address();
    say(`hold ${key} ${tok} 1 ${mode || "plain"} ${addr}`);
    await sleepOn(realClock, hold); // the critical section: not cut short by a stop
    if (this.lines) await this.lines.next(); // EOF (the harness is gone) lets the worker go on
    let trustEnd: number | undefined;
    if (cfg.trust === TRUST_RECEIVE_TTL) {
      const end = recv + sess.ttlMs;
      trustEnd = this.rec.clock.at(end);
      if (performance.now() >= end) lost.record(key, tok, trustEnd, "control: a full TTL since the grant arrived");
    } else if (cfg.trust === TRUST_IGNORE_DONE) {
      trustEnd = undefined; // never before the release
    } else {
      trustEnd = this.real(lock.deadline);
    }
    await this.write(key, mode, tok);

    // A deadline that passed before the release ends trust even if the
    // SDK's timer has not fired yet (the process was stopped or starved).
    const relAt = this.rec.clock.now();
    if (trustEnd !== undefined && trustEnd < relAt) lost.record(key, tok, trustEnd, "deadline passed before the release (lost not set yet)");
    call = this.rec.invoke("release", key, tok);
    let outcome = "ok", err: unknown;
    try {
      await lock.release({ signal: AbortSignal.timeout(RELEASE_TIMEOUT_MS) });
    } catch (e) {
      err = e;
      outcome = e instanceof NotOwnerError || e instanceof InvalidArgumentError ? "fail" : "unknown";
    }
    this.rec.complete(call, outcome, 0n, err === undefined ? "" : errText(err));
    if (outcome === "fail") {
      // Refused: the grant is not this session's current one (or soon will
      // not be); without this the history would show it held forever.
      lost.record(key, tok, relAt, `release refused: ${errText(err)}`);
    }
    say(`free ${key}`);
  }

  async run(): Promise<void> {
    try {
      while (!this.stop.signal.aborted && this.rec.err === undefined) await this.iteration();
    } finally {
      await this.dropSession();
      await this.c.close();
      this.fc.close();
    }
  }
}

function errText(e: unknown): string {
  if (e instanceof LockdError || e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/**
 * Runs the worker until `stop` aborts (the entry, chaosworker.ts, aborts it
 * on SIGTERM and SIGINT); resolves with its exit code. A stop before the
 * first iteration still leaves a history file (its start line).
 */
export async function main(argv: string[], stop: AbortController): Promise<number> {
  let cfg: Config;
  let epoch: bigint;
  try {
    cfg = parseArgs(argv);
    const e = process.env[EPOCH_ENV];
    if (e === undefined || !/^-?\d+$/.test(e)) {
      process.stderr.write(`chaos-worker: ${EPOCH_ENV} not set\n`);
      return 2;
    }
    epoch = BigInt(e);
  } catch (e) {
    process.stderr.write(`chaos-worker: ${(e as Error).message}\n`);
    return 2;
  }
  let rec: Recorder;
  try {
    rec = new Recorder(cfg.history, cfg.proc, new HistoryClock(epoch));
  } catch (e) {
    process.stderr.write(`chaos-worker: history: create recorder: ${(e as Error).message}\n`);
    return 1;
  }
  let w: Worker;
  try {
    w = new Worker(cfg, rec, stop);
  } catch (e) {
    rec.close();
    process.stderr.write(`chaos-worker: ${errText(e)}\n`);
    return 1;
  }
  let failed: unknown;
  try {
    await w.run();
  } catch (e) {
    failed = e; // reported below: the worker must not die silently
  }
  const err = rec.close();
  if (failed !== undefined) {
    process.stderr.write(`chaos-worker: ${errText(failed)}\n`);
    return 1;
  }
  if (err) {
    process.stderr.write(`chaos-worker: ${err}\n`);
    return 1;
  }
  return 0;
}
