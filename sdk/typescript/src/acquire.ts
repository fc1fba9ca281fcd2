// Acquire, TryAcquire and the queue place they keep (the Go SDK's acquire.go;
// C2 #ct2-keep-place, #ct2-multi, #ct2-delay).
import { create } from "@bufbuild/protobuf";
import {
  InvalidArgumentError, LockedError, PermissionDeniedError, WaitTimeoutError,
} from "./errors.js";
import {
  AcquireRequestSchema, InspectRequestSchema, LeaveQueueRequestSchema, LockMode, type AcquireRequest, type AcquireResponse,
} from "./gen/lockd/v1/lockd_pb.js";
import { checkKey, checkLockDelay, checkMaxHold, checkValue, checkWholeMs, MAX_LIMIT } from "./limits.js";
import { Lock, valueBytes } from "./lock.js";
import type { Session } from "./session.js";
import { checkWaitUpdateEvery, startWaitUpdates, type WaitUpdate } from "./wait_updates.js";

/** Options of {@link Session.tryAcquire}. */
export interface TryAcquireOptions {
  /** Gives up when aborted (the promise rejects with the signal's reason). */
  signal?: AbortSignal;
  /** A value attached to the grant (≤ 4 KiB; C2 #ct2-holder). */
  value?: Uint8Array | string;
  /** A semaphore of N holders, 2..1024 (C2 #ct2-multi). */
  limit?: number;
  /** A side of a read/write lock (C2 #ct2-multi). */
  mode?: "shared" | "exclusive";
  /** Lock-delay after an involuntary end, whole ms (plain locks only; C2 #ct2-delay). Default: the session's. */
  lockDelayMs?: number;
  /** Maximum hold, whole ms, 0 or 1 s..168 h (plain locks only; C2 #ct2-delay). */
  maxHoldMs?: number;
}

/** Options of {@link Session.acquire}. */
export interface AcquireOptions extends TryAcquireOptions {
  /** How long to wait in the queue before WaitTimeoutError; 0 or absent: until granted or aborted. */
  waitTimeoutMs?: number;
  /**
   * Opts this wait out of deadlock refusal (C2 #ct2-deadlock): it still counts when the server looks for cycles of
   * waiting sessions but is never the one refused with DeadlockError. For callers that queue on purpose.
   */
  noDeadlockCheck?: boolean;
  /**
   * Reports the wait (C2 #ct2-wait-updates): acquire reads the key with Inspect 300 ms after it starts (or
   * `waitUpdateEveryMs`, if shorter), then every `waitUpdateEveryMs`, and calls this with the first answer and
   * whenever the position, queue length, estimate, holder or error changed; never after acquire settled. Without it
   * no Inspect is sent. The reads need read access to the key: a caller who may not read it gets one update with a
   * PermissionDeniedError and no more. A function that throws ends the updates (logged); nothing about the updates
   * fails the acquire.
   */
  onWaitUpdate?: (u: WaitUpdate) => void;
  /** How often onWaitUpdate's reads come, ms: default 1000, at least 100. */
  waitUpdateEveryMs?: number;
}

function buildRequest(s: Session, key: string, o: TryAcquireOptions, wait: boolean): AcquireRequest {
  const value = valueBytes(o.value);
  checkValue(value);
  const limit = o.limit ?? 0;
  if (!Number.isInteger(limit) || limit < 0 || limit > MAX_LIMIT) {
    throw new InvalidArgumentError(`limit: ${limit}, at most ${MAX_LIMIT}`, "limit");
  }
  const multi = limit > 1 || o.mode !== undefined;
  if (o.mode !== undefined && o.mode !== "shared" && o.mode !== "exclusive") {
    throw new InvalidArgumentError(`mode: ${String(o.mode)} is neither "shared" nor "exclusive"`, "mode");
  }
  if (o.mode !== undefined && limit > 1) throw new InvalidArgumentError("limit: shared and exclusive take no limit", "limit");
  if (multi && (o.lockDelayMs ?? 0) !== 0) {
    throw new InvalidArgumentError("lock_delay: only for plain locks, not with limit or mode", "lock_delay");
  }
  if (multi && (o.maxHoldMs ?? 0) !== 0) {
    throw new InvalidArgumentError("max_hold: only for plain locks, not with limit or mode", "max_hold");
  }
  // The Acquire's lock-delay, else the session's (not sent for a semaphore slot or read/write side).
  const delay = o.lockDelayMs ?? (multi ? 0 : s.lockDelayMs);
  checkLockDelay(delay);
  checkMaxHold(o.maxHoldMs ?? 0);
  return create(AcquireRequestSchema, {
    sessionId: s.id, sessionSecret: s.secret, key, wait, value, limit,
    mode: o.mode === "shared" ? LockMode.SHARED : o.mode === "exclusive" ? LockMode.EXCLUSIVE : LockMode.UNSPECIFIED,
    keepPlace: wait, lockDelayMs: BigInt(delay), maxHoldMs: BigInt(o.maxHoldMs ?? 0),
  });
}

/** Session.acquire: waits in the key's FIFO queue, keeping its place across retries (C2 #ct2-keep-place). */
export async function acquire(s: Session, key: string, o: AcquireOptions): Promise<Lock> {
  const req = buildRequest(s, key, o, true);
  req.noDeadlockCheck = o.noDeadlockCheck ?? false;
  const wt = o.waitTimeoutMs ?? 0;
  checkWholeMs("wait_timeout", Math.ceil(wt));
  req.waitTimeoutMs = BigInt(Math.ceil(wt)); // round up: never wait less than asked
  let stopUpdates: (() => void) | undefined;
  if (o.onWaitUpdate) {
    const every = checkWaitUpdateEvery(o.waitUpdateEveryMs);
    checkKey(key);
    stopUpdates = startWaitUpdates(s, key, every, o.onWaitUpdate);
  }
  try {
    return await send(s, req, wt === 0, o.signal, stopUpdates);
  } catch (e) {
    if (!s.err && !(e instanceof InvalidArgumentError) && !(e instanceof PermissionDeniedError)) {
      leaveQueue(s, key); // the place was kept for a retry that will not come
    }
    throw e;
  } finally {
    stopUpdates?.();
  }
}

/** Session.tryAcquire: a grant only if the key is free and nobody waits; else LockedError naming the holder. */
export async function tryAcquire(s: Session, key: string, o: TryAcquireOptions): Promise<Lock> {
  const req = buildRequest(s, key, o, false);
  try {
    return await send(s, req, false, o.signal);
  } catch (e) {
    if (!(e instanceof LockedError)) throw e;
    throw await lockedBy(s, key);
  }
}

/** LockedError naming key's holder, read with one best-effort Inspect (bounded by a second). */
async function lockedBy(s: Session, key: string): Promise<LockedError> {
  try {
    const r = await s.client.api.inspect(create(InspectRequestSchema, { key }), { signal: AbortSignal.timeout(1000) });
    if (r.held && r.lock) {
      const who = r.lock.owner !== "" ? JSON.stringify(r.lock.owner) : `session ${r.lock.sessionId}`;
      return new LockedError(`locked by another session: held by ${who} token ${r.lock.token}`);
    }
  } catch {
    // plain LockedError
  }
  return new LockedError("locked by another session");
}

/** Sends req until it is answered; with untilAborted a WAIT_TIMEOUT (the server's maximum wait) starts the wait again. */
async function send(s: Session, req: AcquireRequest, untilAborted: boolean, userSignal?: AbortSignal,
  answered?: () => void): Promise<Lock> {
  checkKey(req.key);
  return sendAcquire(s, [req.key], req, untilAborted, userSignal, (resp, sent) => {
    answered?.(); // the wait updates end before the grant is recorded
    if (!resp.granted) throw new LockedError("locked by another session");
    const d = s.extend(sent, Number(resp.remainingMs));
    // C2 #ct2-maxhold-sdk: the hold cannot end before sent + maxHoldMs.
    return s.addLock(req.key, resp.token, d, req.maxHoldMs > 0n ? sent + Number(req.maxHoldMs) : 0);
  });
}

/**
 * Sends an Acquire of keys (acquire's one, acquireAll's several) until it is
 * answered, then hands the answer and its send time to record while the keys
 * are still busy: leaves of the keys' queues still under way are cancelled
 * first (they must not take the place this call resumes or waits for), the
 * session's end also ends the wait, and with untilAborted a WAIT_TIMEOUT (the
 * server's maximum wait: it left every queue) starts the wait again.
 */
export async function sendAcquire<T>(s: Session, keys: string[], req: AcquireRequest, untilAborted: boolean,
  userSignal: AbortSignal | undefined, record: (resp: AcquireResponse, sent: number) => T): Promise<T> {
  if (s.err) throw s.err;
  const c = s.client;
  const dones = keys.map((k) => s.busyKey(k));
  try {
    for (const k of keys) {
      const pending = s.leaving.get(k);
      s.leaving.delete(k);
      if (pending) {
        pending.abort.abort();
        await pending.done;
      }
    }
    const signal = userSignal ? AbortSignal.any([userSignal, s.signal]) : s.signal;
    let sent = 0;
    let resp;
    try {
      resp = await c.retry(signal, async (sig) => {
        for (;;) {
          sent = c.clock.now();
          try {
            return await c.api.acquire(req, { signal: sig });
          } catch (e) {
            if (untilAborted && e instanceof WaitTimeoutError) continue;
            throw e;
          }
        }
      }, userSignal ? undefined : s.callSignal);
    } catch (e) {
      if (s.err && !userSignal?.aborted) throw s.err; // the session ended while waiting
      s.checkServerErr(e);
      throw e;
    }
    if (s.err && !userSignal?.aborted) throw s.err;
    return record(resp, sent);
  } finally {
    for (const done of dones) done();
  }
}

/**
 * Gives up the session's place in key's queue in the background (C2
 * #ct2-keep-place), retrying retryable errors while the session and the
 * client live. A later acquire of key cancels it first.
 */
export function leaveQueue(s: Session, key: string): void {
  const c = s.client;
  const abort = new AbortController();
  const prev = s.leaving.get(key);
  prev?.abort.abort();
  const signal = AbortSignal.any([abort.signal, s.signal, c.signal]);
  const entry = { abort, done: Promise.resolve() };
  entry.done = (async () => {
      try {
        if (prev) await prev.done;
        await c.retry(signal, (sig) =>
          c.api.leaveQueue(create(LeaveQueueRequestSchema, { sessionId: s.id, sessionSecret: s.secret, key }), { signal: sig }));
      } catch {
        // best effort: the session's end leaves every queue anyway
      } finally {
        if (s.leaving.get(key) === entry) s.leaving.delete(key);
      }
    })();
  s.leaving.set(key, entry);
  c.track(entry.done);
}
