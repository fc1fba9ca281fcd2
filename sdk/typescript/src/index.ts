/**
 * @lockd/client — the TypeScript SDK of lockd for Node.
 *
 * ```ts
 * import { Client } from "@lockd/client";
 * const client = new Client("127.0.0.1:7420");
 * const session = await client.newSession();
 * const lock = await session.acquire("jobs/nightly", { signal: AbortSignal.timeout(10_000) });
 * // pass lock.token to the resource; stop when lock.signal aborts
 * await lock.release();
 * await client.close();
 * ```
 *
 * Trust follows C2 #ct2-deadline: a session and its locks are trusted until
 * the client's own send time of the latest answered request plus the
 * server's Remaining minus the safety margin; `lock.signal` aborts and
 * `lock.valid()` turns false at that instant unless a newer answer that lists
 * the lock extended it.
 * @module
 */
export { Client, type ClientOptions, type TLSOptions, type LockInfo, type HolderInfo, type TokenCheck, type WaitEstimate } from "./client.js";
export { Session, type SessionOptions } from "./session.js";
export { Lock } from "./lock.js";
export type { HotKey, HotKeys } from "./hotkeys.js";
export type { AcquireOptions, TryAcquireOptions } from "./acquire.js";
export {
  type WaitUpdate, DEFAULT_WAIT_UPDATE_EVERY_MS, MIN_WAIT_UPDATE_EVERY_MS, WAIT_UPDATE_FIRST_READ_MS,
} from "./wait_updates.js";
export type { AcquireAllOptions, TryAcquireAllOptions } from "./acquire_all.js";
export { Leadership, type Leader } from "./election.js";
export type { WatchEvent, WatchOptions, EventKindName } from "./watch.js";
export { realClock, type Clock, type Timer } from "./clock.js";
export { type TracerProviderLike, type TracerLike, type SpanLike, type SpanContextLike } from "./trace.js";
export {
  LockdError, InvalidArgumentError, LimitMismatchError, SessionDeadError, SessionExpiredError, NotOwnerError,
  PermissionDeniedError, UnavailableError, WaitTimeoutError, LimitError, InternalError, LockedError, LockLostError,
  MaxHoldError, ReleasedError, ClosedError, DeadlockError, ERROR_DOMAIN,
} from "./errors.js";
export type { LockApi, BidiStream, ServerStream, CallOpts } from "./rpc.js";
