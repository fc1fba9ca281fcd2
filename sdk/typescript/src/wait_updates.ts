// Waiting updates (C2 #ct2-wait-updates; the Go SDK's waitupdates.go): an
// Acquire is one unary call, so acquire(key, { onWaitUpdate }) reads the key's
// queue with Inspect while it waits and reports what changed.
import { sleep } from "./clock.js";
import type { LockInfo } from "./client.js";
import { InvalidArgumentError, PermissionDeniedError } from "./errors.js";
import type { Session } from "./session.js";

/** How often the queue is read when `waitUpdateEveryMs` is not given. */
export const DEFAULT_WAIT_UPDATE_EVERY_MS = 1000;
/** The least `waitUpdateEveryMs`. */
export const MIN_WAIT_UPDATE_EVERY_MS = 100;
/** The first read comes this long after acquire starts (or `waitUpdateEveryMs`, if shorter). */
export const WAIT_UPDATE_FIRST_READ_MS = 300;

/** What `acquire(key, { onWaitUpdate })` reports about its wait (C2 #ct2-wait-updates). */
export interface WaitUpdate {
  /** The key waited for. */
  key: string;
  /** The session's place in the queue, 1 = next in line; 0 when the read did not show it waiting (not queued yet, or the key being handed over). */
  position: number;
  /** The queue's length. */
  waiters: number;
  /** The server's estimate of the wait (C2 #ct2-wait-estimate); undefined while it knows none. Never a promise. */
  estimateMs?: number;
  /** The Inspect answer the update comes from. */
  info?: LockInfo;
  /**
   * Set, with empty figures, when the read failed: a PermissionDeniedError once (the caller may not read the key)
   * and no more updates; any other error, and the reads go on.
   */
  error?: Error;
}

/** waitUpdateEveryMs checked: the interval of the reads. */
export function checkWaitUpdateEvery(ms: number | undefined): number {
  if (ms === undefined || ms === 0) return DEFAULT_WAIT_UPDATE_EVERY_MS;
  if (!Number.isFinite(ms) || ms < MIN_WAIT_UPDATE_EVERY_MS) {
    throw new InvalidArgumentError(`wait_update_every: ${ms} ms, at least ${MIN_WAIT_UPDATE_EVERY_MS} ms`, "wait_update_every");
  }
  return ms;
}

/** What a change is judged by: position, queue length, estimate, holder (token), failed or not. */
function fingerprint(u: WaitUpdate): string {
  return `${u.position}/${u.waiters}/${u.estimateMs ?? "-"}/${u.info?.held ?? false}/${u.info?.token ?? 0n}/${u.error === undefined}`;
}

/**
 * Starts reading key's queue for fn every `every` ms. The returned stop ends
 * the reads (a read in flight is aborted); fn is never called after it
 * returned. The loop's promise is tracked by the client.
 */
export function startWaitUpdates(s: Session, key: string, every: number, fn: (u: WaitUpdate) => void): () => void {
  const c = s.client;
  const ac = new AbortController();
  let stopped = false;
  const loop = (async () => {
    let last: string | undefined;
    let d = Math.min(WAIT_UPDATE_FIRST_READ_MS, every);
    while (await sleep(c.clock, d, ac.signal)) {
      const sent = c.clock.now();
      let u: WaitUpdate;
      try {
        const info = await c.inspect(key, { signal: AbortSignal.any([ac.signal, AbortSignal.timeout(Math.max(every, 1000))]) });
        if (info.held && (info.session === s.id || info.holders.some((h) => h.session === s.id))) {
          u = { key, position: -1, waiters: 0 }; // granted: the reply is on its way; not reported
        } else {
          const i = info.waiters.indexOf(s.id);
          u = { key, position: i + 1, waiters: info.waiters.length, info };
          const e = info.waitEstimates.find((w) => w.session === s.id);
          if (e) u.estimateMs = e.waitMs;
        }
      } catch (e) {
        u = { key, position: 0, waiters: 0, error: e instanceof Error ? e : new Error(String(e)) };
      }
      if (stopped) return;
      if (u.position >= 0) {
        const f = fingerprint(u);
        if (f !== last) {
          last = f;
          try {
            fn(u);
          } catch (e) { // the caller's: it ends the updates, never the acquire
            c.debug(`onWaitUpdate threw, no more wait updates for ${JSON.stringify(key)}`, e);
            return;
          }
        }
        if (u.error instanceof PermissionDeniedError) return;
      }
      d = Math.max(0, every - (c.clock.now() - sent));
    }
  })();
  c.track(loop);
  return () => {
    stopped = true;
    ac.abort();
  };
}
