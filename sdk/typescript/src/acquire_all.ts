// Several locks at once, all or none (C2 #ct2-acquire-all; the Go SDK's
// acquire_all.go): one Acquire call with every key.
import { create } from "@bufbuild/protobuf";
import { sendAcquire } from "./acquire.js";
import { InvalidArgumentError, LockedError, UnavailableError } from "./errors.js";
import { AcquireRequestSchema, ReleaseRequestSchema, type AcquireRequest } from "./gen/lockd/v1/lockd_pb.js";
import { checkKey, checkWholeMs } from "./limits.js";
import type { Lock } from "./lock.js";
import type { Session } from "./session.js";

/** At most this many keys in one acquireAll (wirelimits.MaxAcquireKeys). */
export const MAX_ACQUIRE_KEYS = 64;

/** Options of {@link Session.tryAcquireAll}. */
export interface TryAcquireAllOptions {
  /** Gives up when aborted (the promise rejects with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link Session.acquireAll}. */
export interface AcquireAllOptions extends TryAcquireAllOptions {
  /** How long to wait for the whole set before WaitTimeoutError; 0 or absent: until granted or aborted. */
  waitTimeoutMs?: number;
  /** None of the call's waits is ever a deadlock's victim (C2 #ct2-acquire-all, #ct2-deadlock). */
  noDeadlockCheck?: boolean;
}

function checkKeys(keys: string[]): void {
  if (!Array.isArray(keys)) throw new InvalidArgumentError("keys: not an array of keys", "keys");
  if (keys.length < 1 || keys.length > MAX_ACQUIRE_KEYS) {
    throw new InvalidArgumentError(`keys: ${keys.length} keys, want 1..${MAX_ACQUIRE_KEYS}`, "keys");
  }
  for (const k of keys) checkKey(k, "keys");
  if (new Set(keys).size !== keys.length) throw new InvalidArgumentError("keys: a key is named twice", "keys");
}

/** Session.acquireAll: every key or none, waiting in each key's queue in ascending key order (server side). */
export async function acquireAll(s: Session, keys: string[], o: AcquireAllOptions): Promise<Lock[]> {
  checkKeys(keys);
  const wt = o.waitTimeoutMs ?? 0;
  checkWholeMs("wait_timeout", Math.ceil(wt));
  const req = create(AcquireRequestSchema, {
    sessionId: s.id, sessionSecret: s.secret, keys: [...keys], wait: true, waitTimeoutMs: BigInt(Math.ceil(wt)),
    noDeadlockCheck: o.noDeadlockCheck ?? false,
  });
  return send(s, req, wt === 0, o.signal);
}

/** Session.tryAcquireAll: every key if each is free and nobody waits; else LockedError and none. */
export async function tryAcquireAll(s: Session, keys: string[], o: TryAcquireAllOptions): Promise<Lock[]> {
  checkKeys(keys);
  const req = create(AcquireRequestSchema, { sessionId: s.id, sessionSecret: s.secret, keys: [...keys] });
  return send(s, req, false, o.signal);
}

/** Sends req until it is answered and records the grants; a grant it cannot record fails the call and the others are given back. */
async function send(s: Session, req: AcquireRequest, untilAborted: boolean, userSignal?: AbortSignal): Promise<Lock[]> {
  return sendAcquire(s, req.keys, req, untilAborted, userSignal, (resp, sent) => {
    if (!resp.granted) throw new LockedError(`one of ${JSON.stringify(req.keys)} is locked by another session`);
    if (resp.grants.length !== req.keys.length) {
      throw new UnavailableError(`the server answered ${resp.grants.length} grants for ${req.keys.length} keys`);
    }
    const d = s.extend(sent, Number(resp.remainingMs));
    const locks: Lock[] = [];
    const fresh: Lock[] = []; // the Locks this call made (not a Lock the session had)
    for (let i = 0; i < resp.grants.length; i++) {
      const g = resp.grants[i];
      const had = s.locks.get(req.keys[i]);
      try {
        if (g.key !== req.keys[i]) throw new UnavailableError(`grant ${i} names ${JSON.stringify(g.key)}, not ${JSON.stringify(req.keys[i])}`);
        const l = s.addLock(g.key, g.token, d);
        if (l !== had) fresh.push(l);
        locks.push(l);
      } catch (e) {
        // All or none: give back what this call was granted, best effort.
        giveBack(s, fresh, resp.grants.slice(i));
        throw e;
      }
    }
    return locks;
  });
}

function giveBack(s: Session, fresh: Lock[], rest: { key: string; token: bigint }[]): void {
  const c = s.client;
  c.background(async () => {
    const signal = AbortSignal.any([c.signal, AbortSignal.timeout(c.closeTimeoutMs)]);
    for (const l of fresh) await l.release({ signal }).catch(() => undefined);
    for (const g of rest) {
      const l = s.locks.get(g.key);
      if (l && l.token === g.token) continue;
      await c.api.release(create(ReleaseRequestSchema, { sessionId: s.id, sessionSecret: s.secret, key: g.key, token: g.token }), { signal })
        .catch(() => undefined);
    }
  });
}
