// Errors of the SDK: one class per condition, mapped from the wire's gRPC code
// and google.rpc.ErrorInfo reason (domain lockd.lock.dev) in one place,
// fromGrpcError — as client/errors.go does for the Go SDK (C2 #ct2-errors,
// #ct2-wire-auth, #ct2-limits).
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";

/** The ErrorInfo domain of lockd's wire errors. */
export const ERROR_DOMAIN = "lockd.lock.dev";

/** gRPC status codes the SDK maps (the numbers of google.rpc.Code). */
export const enum Code {
  OK = 0,
  CANCELLED = 1,
  UNKNOWN = 2,
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  PERMISSION_DENIED = 7,
  RESOURCE_EXHAUSTED = 8,
  FAILED_PRECONDITION = 9,
  ABORTED = 10,
  INTERNAL = 13,
  UNAVAILABLE = 14,
  UNAUTHENTICATED = 16,
}

/** Base class of every error the SDK raises for a lockd condition. */
export class LockdError extends Error {
  /** The gRPC status code the server answered with, when it came from the wire. */
  readonly code?: number;
  /** The ErrorInfo reason (C2 #ct2-errors), e.g. "SESSION_DEAD"; "" when none. */
  readonly reason: string;
  constructor(message: string, opts: { code?: number; reason?: string; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = opts.code;
    this.reason = opts.reason ?? "";
  }
}

/** The request is wrong (bad key, TTL, wait timeout, a margin the TTL cannot carry). `field` names the field when known. */
export class InvalidArgumentError extends LockdError {
  constructor(message: string, readonly field = "", opts: { code?: number; reason?: string } = {}) {
    super(message, { reason: "INVALID_ARGUMENT", ...opts });
  }
}

/** An acquire's limit or mode disagrees with the kind of lock the key's holders and waiters use (C2 #ct2-multi). */
export class LimitMismatchError extends LockdError {}

/**
 * DEADLOCK (code ABORTED): the acquire's wait closed a cycle of waiting sessions and
 * was refused (C2 #ct2-deadlock). Never retried; `keys` are the cycle's keys,
 * sorted. The session keeps its other locks.
 */
export class DeadlockError extends LockdError {
  constructor(message: string, readonly keys: string[] = [], opts: { code?: number; reason?: string } = {}) {
    super(message, { reason: "DEADLOCK", ...opts });
  }
}

/** The server reports the session unknown, expired, lost or closed. Terminal. */
export class SessionDeadError extends LockdError {}

/**
 * The session's local deadline (send time + Remaining − safety margin) passed
 * without a fresh answer, e.g. while the server was unreachable (C2
 * #ct2-deadline). It is a {@link SessionDeadError} too.
 */
export class SessionExpiredError extends SessionDeadError {
  constructor(message = "session expired (deadline passed without acknowledgement)") {
    super(message);
  }
}

/** A release or value named a grant that is not the key's current one: the lock was lost before. */
export class NotOwnerError extends LockdError {}

/**
 * The server refused the call for want of authority: a session secret or
 * principal that does not match (C2 #ct2-ownership), no access rule
 * (ACCESS_DENIED), or credentials it does not accept (UNAUTHENTICATED).
 */
export class PermissionDeniedError extends LockdError {}

/** The server or its backend is unreachable or busy; the SDK retries it until the caller gives up. */
export class UnavailableError extends LockdError {}

/** An acquire's `waitTimeoutMs` ran out before the lock was granted. */
export class WaitTimeoutError extends LockdError {}

/** A server limit was reached (C2 #ct2-limits); `limit` names it ("sessions", "waiters", …). Not retried. */
export class LimitError extends LockdError {
  constructor(message: string, readonly limit: string, opts: { code?: number; reason?: string } = {}) {
    super(message, opts);
  }
}

/** The server failed unexpectedly; details are in its log. */
export class InternalError extends LockdError {}

/** tryAcquire found the key held by another session, or waiters queued for it. */
export class LockedError extends LockdError {}

/** The lock is gone: revoked, expired with its session, or no longer confirmed by the server (C2 #ct2-confirm). */
export class LockLostError extends LockdError {}

/** The lock was held longer than its `maxHoldMs` and the server revoked it. It is a {@link LockLostError} too. */
export class MaxHoldError extends LockLostError {}

/** The lock was released by {@link Lock.release}. */
export class ReleasedError extends LockdError {}

/** The session or client was closed by its owner. */
export class ClosedError extends LockdError {}

/** What google.rpc.Status details lockd sends: the ErrorInfo and a BadRequest's first field violation. */
export interface StatusDetails {
  reason: string;
  metadata: Record<string, string>;
  field?: string;
  description?: string;
}

const ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo";
const BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest";

/** Decodes the binary google.rpc.Status of the grpc-status-details-bin trailer. */
export function decodeStatusDetails(bin: Uint8Array): StatusDetails {
  const out: StatusDetails = { reason: "", metadata: {} };
  const r = new BinaryReader(bin);
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    if (no !== 3 || wt !== WireType.LengthDelimited) {
      r.skip(wt, no);
      continue;
    }
    // google.protobuf.Any
    const any = new BinaryReader(r.bytes());
    let typeUrl = "";
    let value: Uint8Array = new Uint8Array();
    while (any.pos < any.len) {
      const [ano, awt] = any.tag();
      if (ano === 1 && awt === WireType.LengthDelimited) typeUrl = any.string();
      else if (ano === 2 && awt === WireType.LengthDelimited) value = any.bytes();
      else any.skip(awt, ano);
    }
    if (typeUrl === ERROR_INFO) decodeErrorInfo(value, out);
    else if (typeUrl === BAD_REQUEST && out.field === undefined) decodeBadRequest(value, out);
  }
  return out;
}

function decodeErrorInfo(b: Uint8Array, out: StatusDetails): void {
  const r = new BinaryReader(b);
  let reason = "";
  let domain = "";
  const md: Record<string, string> = {};
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    if (no === 1 && wt === WireType.LengthDelimited) reason = r.string();
    else if (no === 2 && wt === WireType.LengthDelimited) domain = r.string();
    else if (no === 3 && wt === WireType.LengthDelimited) {
      const e = new BinaryReader(r.bytes());
      let k = "";
      let v = "";
      while (e.pos < e.len) {
        const [eno, ewt] = e.tag();
        if (eno === 1 && ewt === WireType.LengthDelimited) k = e.string();
        else if (eno === 2 && ewt === WireType.LengthDelimited) v = e.string();
        else e.skip(ewt, eno);
      }
      md[k] = v;
    } else r.skip(wt, no);
  }
  if (domain === ERROR_DOMAIN) {
    out.reason = reason;
    out.metadata = md;
  }
}

function decodeBadRequest(b: Uint8Array, out: StatusDetails): void {
  const r = new BinaryReader(b);
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    if (no !== 1 || wt !== WireType.LengthDelimited) {
      r.skip(wt, no);
      continue;
    }
    const v = new BinaryReader(r.bytes());
    let field = "";
    let desc = "";
    while (v.pos < v.len) {
      const [vno, vwt] = v.tag();
      if (vno === 1 && vwt === WireType.LengthDelimited) field = v.string();
      else if (vno === 2 && vwt === WireType.LengthDelimited) desc = v.string();
      else v.skip(vwt, vno);
    }
    out.field = field;
    out.description = desc;
    return;
  }
}

/**
 * Maps a gRPC code, ErrorInfo reason and message to the SDK's error class: the
 * one place where codes map back (the Go SDK's mapCode).
 */
export function fromCode(code: number, reason: string, message: string, details?: StatusDetails): LockdError {
  const o = { code, reason };
  switch (code) {
    case Code.INVALID_ARGUMENT:
      if (reason === "LIMIT_MISMATCH") return new LimitMismatchError(message, o);
      if (details?.field) return new InvalidArgumentError(`${details.field}: ${details.description ?? message}`, details.field, o);
      return new InvalidArgumentError(message, "", o);
    case Code.FAILED_PRECONDITION:
      return new SessionDeadError(message, o);
    case Code.PERMISSION_DENIED:
      // NOT_OWNER (and a reason-less answer of an older server) is a release
      // of a grant that is gone; every other reason is a refusal.
      if (reason === "" || reason === "NOT_OWNER") return new NotOwnerError(message, o);
      return new PermissionDeniedError(message, o);
    case Code.UNAUTHENTICATED:
      return new PermissionDeniedError(message, o);
    case Code.ABORTED:
      if (reason === "DEADLOCK") return new DeadlockError(message, deadlockKeys(details?.metadata["keys"]), o);
      return new UnavailableError(message, o);
    case Code.UNAVAILABLE:
      return new UnavailableError(message, o);
    case Code.DEADLINE_EXCEEDED:
      if (reason === "WAIT_TIMEOUT") return new WaitTimeoutError(message, o);
      return new LockdError(message, o);
    case Code.RESOURCE_EXHAUSTED:
      return new LimitError(message, details?.metadata["limit"] ?? "", o);
    default:
      return new InternalError(message, o);
  }
}

/** The keys of a DEADLOCK's ErrorInfo metadata (a JSON array of strings); [] when malformed. */
function deadlockKeys(raw: string | undefined): string[] {
  try {
    const v: unknown = JSON.parse(raw ?? "[]");
    return Array.isArray(v) ? v.filter((k): k is string => typeof k === "string") : [];
  } catch {
    return [];
  }
}

/** The shape of a @grpc/grpc-js ServiceError that the SDK reads. */
interface GrpcLikeError {
  code?: unknown;
  details?: unknown;
  metadata?: { get(key: string): unknown[] };
}

/** Maps an error thrown by a gRPC call to the SDK's classes. Anything that is not a gRPC status stays as it is. */
export function fromGrpcError(err: unknown): unknown {
  if (err instanceof LockdError) return err;
  const e = err as GrpcLikeError;
  if (e === null || typeof e !== "object" || typeof e.code !== "number") return err;
  let details: StatusDetails | undefined;
  const bin = e.metadata?.get("grpc-status-details-bin")?.[0];
  if (bin instanceof Uint8Array) {
    try {
      details = decodeStatusDetails(bin);
    } catch {
      details = undefined; // a malformed trailer: the code alone decides
    }
  }
  const msg = typeof e.details === "string" ? e.details : String(err);
  return fromCode(e.code, details?.reason ?? "", msg, details);
}

/** Whether the SDK retries err (the retryable class of C2 #ct2-errors). */
export function retryable(err: unknown): boolean {
  return err instanceof UnavailableError;
}
