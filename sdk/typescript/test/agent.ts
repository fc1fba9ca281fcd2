// A JSON-lines agent: drives the SDK from another process, so that one
// scenario suite can run through every SDK and compare outcome strings
// (issue 25; the protocol of sdk/python's lockd._agent). Run it as
// `node dist/test/agent.js`; it is not part of the npm package.
//
// One JSON object per line; stdin requests, stdout replies and notices.
// - request: {"id": N, "op": OP, ...arguments}; every request runs
//   concurrently (a waiting acquire does not hold up the next one); replies
//   may come out of order.
// - reply: {"id": N, "ok": true, ...results} or {"id": N, "ok": false,
//   "error": NAME, "reason": WIRE_REASON, "message": TEXT}, NAME the Go SDK's
//   sentinel name (ErrLocked, ErrWaitTimeout, ErrLockLost, …;
//   context.Canceled for a cancelled call); an ErrDeadlock reply also
//   carries "keys", the cycle's keys.
// - notice (no id): {"event": "lost", "lock": H, "error": NAME} when a lock's
//   trust ends (not for a release); {"event": "watch", "watch": H, "kind",
//   "key", "session", "token", "owner", "labels", "value"} per watch event ("error" on
//   the last one when it broke); {"event": "observe", "observer": H,
//   "leader": bool, "session", "token", "owner", "value"} per observation.
// Objects are named by handles (c1, s2, l3, w4, o5). Durations are seconds,
// values UTF-8 text, tokens JSON numbers (exact below 2^53).
import { createInterface } from "node:readline";
import {
  Client, ClosedError, DeadlockError, InternalError, InvalidArgumentError, Leadership, LimitError, LimitMismatchError, Lock,
  LockdError, LockedError, LockLostError, MaxHoldError, NotOwnerError, PermissionDeniedError, ReleasedError,
  Session, SessionDeadError, SessionExpiredError, UnavailableError, WaitTimeoutError, type TryAcquireOptions,
} from "../src/index.js";

type Req = Record<string, unknown> & { id?: number; op?: string };

const NAMES: [new (...a: never[]) => Error, string][] = [
  [LimitMismatchError, "ErrLimitMismatch"], [InvalidArgumentError, "ErrInvalidArgument"],
  [SessionExpiredError, "ErrSessionExpired"], [SessionDeadError, "ErrSessionDead"], [NotOwnerError, "ErrNotOwner"],
  [LockedError, "ErrLocked"], [WaitTimeoutError, "ErrWaitTimeout"], [DeadlockError, "ErrDeadlock"], [MaxHoldError, "ErrMaxHold"],
  [LockLostError, "ErrLockLost"], [ReleasedError, "ErrReleased"], [ClosedError, "ErrClosed"], [LimitError, "ErrLimit"],
  [InternalError, "ErrInternal"], [UnavailableError, "ErrUnavailable"], [PermissionDeniedError, "ErrPermissionDenied"],
];

/** The Go SDK's sentinel name of an error. */
export function errName(e: unknown): string {
  if (e === undefined || e === null) return "ok";
  for (const [cls, name] of NAMES) if (e instanceof cls) return name;
  if (e instanceof Error && e.name === "AbortError") return "context.Canceled";
  if (e instanceof Error && e.name === "TimeoutError") return "context.DeadlineExceeded";
  return `unexpected(${e instanceof Error ? e.name : typeof e})`;
}

const text = (b: Uint8Array) => new TextDecoder().decode(b);
const ms = (s: unknown) => (typeof s === "number" ? Math.round(s * 1000) : undefined);

class Agent {
  private readonly objs = new Map<string, unknown>();
  private readonly calls = new Map<number, AbortController>();
  private readonly stops: AbortController[] = [];
  private n = 0;

  send(m: Record<string, unknown>): void {
    process.stdout.write(JSON.stringify(m) + "\n");
  }

  private put(kind: string, o: unknown): string {
    const h = `${kind}${++this.n}`;
    this.objs.set(h, o);
    return h;
  }

  private get<T>(h: unknown, cls: abstract new (...a: never[]) => T): T {
    const o = this.objs.get(String(h));
    if (!(o instanceof cls)) throw new InvalidArgumentError(`no object ${JSON.stringify(h)}`);
    return o;
  }

  private lock(l: Lock, holder: unknown = l): Record<string, unknown> {
    const h = this.put("l", holder);
    l.signal.addEventListener("abort", () => {
      if (!(l.err instanceof ReleasedError)) this.send({ event: "lost", lock: h, error: errName(l.err) });
    });
    return { lock: h, token: Number(l.token) };
  }

  private theLock(h: unknown): Lock {
    const o = this.objs.get(String(h));
    if (o instanceof Leadership) return o.lock;
    return this.get(h, Lock);
  }

  private opts(r: Req): TryAcquireOptions {
    const o: TryAcquireOptions = { value: String(r.value ?? "") };
    if (r.limit) o.limit = Number(r.limit);
    if (r.mode === "shared" || r.mode === "exclusive") o.mode = r.mode;
    if (r.lock_delay !== undefined) o.lockDelayMs = ms(r.lock_delay);
    if (r.max_hold !== undefined) o.maxHoldMs = ms(r.max_hold);
    return o;
  }

  private async waiting<T>(id: number, f: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const ac = new AbortController();
    this.calls.set(id, ac);
    try {
      return await f(ac.signal);
    } finally {
      this.calls.delete(id);
    }
  }

  async handle(r: Req): Promise<Record<string, unknown> | void> {
    const id = Number(r.id ?? 0);
    switch (r.op) {
      case "client": {
        const addrs = (r.addresses as string[]).join(",");
        const tls = r.ca_file ? { caFile: String(r.ca_file), certFile: r.cert_file as string | undefined, keyFile: r.key_file as string | undefined } : undefined;
        const c = new Client(addrs, {
          tls, tokenFile: r.token_file as string | undefined, ttlMs: ms(r.ttl) || undefined,
          safetyMarginMs: ms(r.safety_margin) || undefined, heartbeatIntervalMs: ms(r.heartbeat_interval) || undefined,
          backoffMinMs: 10, backoffMaxMs: 200,
        });
        return { client: this.put("c", c) };
      }
      case "session": {
        const s = await this.get(r.client, Client).newSession({
          ttlMs: ms(r.ttl) || undefined, owner: (r.owner as string) ?? "", labels: (r.labels as Record<string, string>) ?? {},
          lockDelayMs: ms(r.lock_delay) ?? 0,
        });
        return { session: this.put("s", s), session_id: s.id };
      }
      case "acquire": {
        const s = this.get(r.session, Session);
        const l = await this.waiting(id, (signal) => s.acquire(String(r.key), {
          ...this.opts(r), signal, waitTimeoutMs: ms(r.timeout), noDeadlockCheck: !!r.no_deadlock_check,
        }));
        return this.lock(l);
      }
      case "acquire_all": {
        const s = this.get(r.session, Session);
        const ls = await this.waiting(id, (signal) => s.acquireAll(r.keys as string[], {
          signal, waitTimeoutMs: ms(r.timeout), noDeadlockCheck: !!r.no_deadlock_check,
        }));
        return { locks: ls.map((l) => ({ key: l.key, ...this.lock(l) })) };
      }
      case "try_acquire_all": {
        const ls = await this.get(r.session, Session).tryAcquireAll(r.keys as string[]);
        return { locks: ls.map((l) => ({ key: l.key, ...this.lock(l) })) };
      }
      case "try_acquire":
        return this.lock(await this.get(r.session, Session).tryAcquire(String(r.key), this.opts(r)));
      case "campaign": {
        const s = this.get(r.session, Session);
        const lead = await this.waiting(id, async (signal) => {
          const wt = ms(r.timeout);
          if (wt === undefined) return s.campaign(String(r.name), String(r.value ?? ""), { signal });
          return new Leadership(await s.acquire(String(r.name), { value: String(r.value ?? ""), signal, waitTimeoutMs: wt }));
        });
        return this.lock(lead.lock, lead);
      }
      case "cancel":
        this.calls.get(Number(r.call))?.abort();
        return;
      case "release": {
        const o = this.objs.get(String(r.lock));
        if (o instanceof Leadership) await o.resign();
        else await this.get(r.lock, Lock).release();
        return;
      }
      case "set_value":
        await this.theLock(r.lock).setValue(String(r.value ?? ""));
        return;
      case "proclaim":
        await this.get(r.lock, Leadership).proclaim(String(r.value ?? ""));
        return;
      case "lock_state": {
        const l = this.theLock(r.lock);
        return { valid: l.valid(), error: errName(l.err), token: Number(l.token), deadline_in: (l.deadline - performance.now()) / 1000 };
      }
      case "session_state": {
        const s = this.get(r.session, Session);
        return { valid: s.valid(), error: errName(s.err), deadline_in: (s.deadline - performance.now()) / 1000 };
      }
      case "close_session":
        await this.get(r.session, Session).close();
        return;
      case "inspect": {
        const i = await this.get(r.client, Client).inspect(String(r.key));
        return {
          held: i.held, session: i.session, token: Number(i.token), waiters: i.waiters, owner: i.owner, labels: i.labels,
          value: text(i.value), limit: i.limit,
          holders: i.holders.map((h) => ({ session: h.session, token: Number(h.token), mode: h.mode })),
          lock_delay: i.lockDelayMs / 1000, delay_remaining: i.delayRemainingMs / 1000,
        };
      }
      case "list": {
        const { locks } = await this.get(r.client, Client).list(String(r.prefix ?? ""));
        return {
          keys: locks.map((l) => l.key),
          locks: locks.map((l) => ({ key: l.key, session: l.session, token: Number(l.token), owner: l.owner, value: text(l.value) })),
        };
      }
      case "revoke": {
        const v = await this.get(r.client, Client).revoke(String(r.key));
        return { held: v.revoked, session: v.session, token: Number(v.token) };
      }
      case "check": {
        const tc = await this.get(r.client, Client).checkToken(String(r.key), BigInt(Number(r.token ?? 0)), { cached: !!r.cached });
        return { current: tc.current, tokens: tc.tokens.map(Number), cached: tc.cached };
      }
      case "watch": {
        const ac = new AbortController();
        this.stops.push(ac);
        const w = await this.get(r.client, Client).watch(String(r.prefix ?? ""), { holders: !!r.holders, signal: ac.signal });
        const h = this.put("w", ac);
        void (async () => {
          try {
            for await (const e of w) {
              this.send({ event: "watch", watch: h, kind: e.kind, key: e.key, session: e.session, token: Number(e.token), owner: e.owner, labels: e.labels, value: text(e.value) });
            }
          } catch (e) {
            this.send({ event: "watch", watch: h, error: errName(e) });
          }
        })();
        return { watch: h };
      }
      case "observe": {
        const ac = new AbortController();
        this.stops.push(ac);
        const h = this.put("o", ac);
        const it = this.get(r.client, Client).observe(String(r.name), { signal: ac.signal });
        void (async () => {
          try {
            for await (const x of it) {
              this.send(x === null ? { event: "observe", observer: h, leader: false, session: "", token: 0, owner: "", value: "" }
                : { event: "observe", observer: h, leader: true, session: x.session, token: Number(x.token), owner: x.owner, value: text(x.value) });
            }
          } catch (e) {
            this.send({ event: "observe", observer: h, error: errName(e) });
          }
        })();
        return { observer: h };
      }
      case "stop_watch":
      case "stop_observe":
        this.get(r.watch ?? r.observer, AbortController).abort();
        return;
      case "close_client":
        await this.get(r.client, Client).close();
        return;
    }
    throw new InvalidArgumentError(`unknown op ${JSON.stringify(r.op)}`);
  }

  async close(): Promise<void> {
    for (const ac of [...this.calls.values(), ...this.stops]) ac.abort();
    await Promise.allSettled([...this.objs.values()].filter((o) => o instanceof Client).map((c) => (c as Client).close()));
  }
}

async function main(): Promise<void> {
  const agent = new Agent();
  const pending = new Set<Promise<void>>();
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (line.trim() === "") continue;
    let req: Req;
    try {
      req = JSON.parse(line) as Req;
    } catch (e) {
      agent.send({ id: 0, ok: false, error: "bad-request", message: String(e) });
      continue;
    }
    if (req.op === "quit") {
      agent.send({ id: req.id ?? 0, ok: true });
      break;
    }
    const p = agent.handle(req).then(
      (res) => agent.send({ id: req.id ?? 0, ok: true, ...(res ?? {}) }),
      (e: unknown) => agent.send({
        id: req.id ?? 0, ok: false, error: errName(e), reason: e instanceof LockdError ? e.reason : "",
        message: e instanceof Error ? e.message : String(e), ...(e instanceof DeadlockError ? { keys: e.keys } : {}),
      }),
    );
    pending.add(p);
    void p.finally(() => pending.delete(p));
  }
  await agent.close();
  await Promise.allSettled([...pending]);
  process.exit(0);
}

void main();
