// Lock: a granted lock, trusted until its signal aborts (the Go SDK's lock.go).
import { create } from "@bufbuild/protobuf";
import { LockLostError, NotOwnerError, ReleasedError, retryable } from "./errors.js";
import { ReleaseRequestSchema, SetValueRequestSchema } from "./gen/lockd/v1/lockd_pb.js";
import { checkValue } from "./limits.js";
import type { Session } from "./session.js";

/** A released lock's error, made when asked for (Lock._err). */
const RELEASED = Symbol("released");

/** Bytes of a value given as a string (UTF-8) or as bytes. */
export function valueBytes(v: Uint8Array | string | undefined): Uint8Array {
  if (v === undefined) return new Uint8Array();
  return typeof v === "string" ? new TextEncoder().encode(v) : v;
}

/**
 * A granted lock. It is trusted while {@link valid} is true; {@link signal}
 * aborts, with {@link err} as its reason, the moment it stops being trusted:
 * its session's deadline passed or the session ended, the server reported the
 * lock revoked or expired, a heartbeat answer no longer listed it or none
 * listed it before its own deadline, or it was released.
 */
export class Lock {
  /** @internal the lock's own deadline: its grant reply's, or the latest answer that listed it (C2 #ct2-confirm) */
  ownDeadline: number;
  // Made when first asked for (signal, err): most locks are released without
  // anyone looking at either, and an AbortController and an Error with its
  // stack per pair were a measurable share of the SDK's CPU (issue 25 SDK-TS).
  private ac?: AbortController;
  private _e?: Error | typeof RELEASED;
  private ambiguous = false; // a release attempt may have taken effect
  private releasedOK = false;

  /** @internal */
  constructor(
    /** @internal */ readonly session: Session,
    /** The lock's key. */
    readonly key: string,
    /**
     * The grant's fencing token: strictly increasing over successive grants
     * of the key. Pass it to the resource the lock protects, and have the
     * resource reject tokens lower than the highest it has seen.
     */
    readonly token: bigint,
    /** @internal Session.lockSeq when added */
    readonly seq: number,
    deadline: number,
    /**
     * @internal the send time of the Acquire that granted the lock plus its
     * maxHoldMs (0: none): a lock no answer confirms from then on ends with
     * MaxHoldError (C2 #ct2-maxhold-sdk). Set here, never changed.
     */
    readonly maxHoldAt = 0,
  ) {
    this.ownDeadline = deadline;
  }

  /** Aborts when the lock can no longer be trusted; its reason is {@link err}. */
  get signal(): AbortSignal {
    if (!this.ac) {
      this.ac = new AbortController();
      if (this._e !== undefined) this.ac.abort(this._err);
    }
    return this.ac.signal;
  }

  /** The error the lock ended with, the release's made now if the lock was released. */
  private get _err(): Error | undefined {
    if (this._e === RELEASED) this._e = new ReleasedError("lock released");
    return this._e;
  }

  /** Undefined while the lock is trusted; afterwards why not (ReleasedError, LockLostError, or the session's error). */
  get err(): Error | undefined {
    return this._err;
  }

  /**
   * The instant (on the client's clock, ms; `performance.now()` by default)
   * at which the lock stops being trusted unless a newer answer that confirms
   * it extends it: the earlier of its own deadline and its session's.
   */
  get deadline(): number {
    return Math.min(this.ownDeadline, this.session.deadline);
  }

  /**
   * Whether the lock is trusted now: not ended, and the client's clock
   * (`performance.now()`) is before its deadline. Check it right before
   * acting on the protected resource; the signal fires at the same instant
   * from a timer, which a busy event loop can delay.
   */
  valid(): boolean {
    return this._e === undefined && this.session.client.clock.now() < this.deadline;
  }

  /** Throws {@link err} if the lock is no longer trusted. */
  throwIfLost(): void {
    if (!this.valid()) throw this._err ?? new LockLostError("lock lost: its deadline passed");
  }

  /** @internal */
  end(err: Error | typeof RELEASED): void {
    if (this._e !== undefined) return;
    this._e = err;
    this.ac?.abort(this._err);
  }

  /**
   * Replaces the value attached to the grant: the grant and its token do not
   * change. LockLostError once the lock is no longer trusted; NotOwnerError
   * when the server finds the grant gone. It never takes the lock again.
   */
  async setValue(value: Uint8Array | string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    const v = valueBytes(value);
    checkValue(v);
    if (this._err) throw this._err instanceof LockLostError ? this._err : new LockLostError(`lock lost: ${this._err.message}`, { cause: this._err });
    const s = this.session;
    const c = s.client;
    await c.retry(opts.signal, (signal) =>
      c.api.setValue(create(SetValueRequestSchema, { sessionId: s.id, sessionSecret: s.secret, key: this.key, token: this.token, value: v }), { signal }));
  }

  /**
   * Releases the lock. It stops trusting the lock first (its signal aborts),
   * then deletes the grant on the server, checked by fencing token so it
   * never deletes a newer grant. Safe to retry: when an earlier attempt may
   * have taken effect and a retry finds the grant gone, it resolves — unless
   * the lock had already been lost before the call: then NotOwnerError.
   */
  async release(opts: { signal?: AbortSignal } = {}): Promise<void> {
    const lostBefore = this._err instanceof ReleasedError ? undefined : this._err;
    const s = this.session;
    const c = s.client;
    const done = s.busyKey(this.key);
    try {
      if (s.locks.get(this.key) === this) s.locks.delete(this.key);
      this.end(RELEASED);
      if (this.releasedOK) return;
      await c.retry(opts.signal, async (signal) => {
        try {
          await c.api.release(create(ReleaseRequestSchema, { sessionId: s.id, sessionSecret: s.secret, key: this.key, token: this.token }), { signal });
          this.releasedOK = true;
        } catch (e) {
          if (e instanceof NotOwnerError && this.ambiguous) {
            if (lostBefore) throw new NotOwnerError(`${e.message} (the lock was lost before the release: ${lostBefore.message})`, { code: e.code, reason: e.reason });
            this.releasedOK = true;
            return;
          }
          if (retryable(e) || signal?.aborted) this.ambiguous = true;
          throw e;
        }
      });
    } finally {
      done();
    }
  }
}
