"""Exception classes of the lockd SDK, one per wire reason.

Every failed call raises a :class:`LockdError` subclass chosen by the
``google.rpc.ErrorInfo`` reason of the server's status (domain
``lockd.lock.dev``), else by its gRPC code (docs/contracts/C2.md #ct2-errors,
#ct2-sdk rule 9). ``reason`` holds the wire reason when the server sent one.
Messages never contain session secrets or bearer tokens.
"""

from __future__ import annotations

import json

import grpc

from . import _status

DOMAIN = "lockd.lock.dev"


class LockdError(Exception):
    """Base class of every error the SDK raises."""

    #: whether the SDK retries it (with backoff) before giving up
    retryable = False

    def __init__(self, message: str = "", reason: str = "", code: grpc.StatusCode | None = None):
        super().__init__(message or self.__class__.__name__)
        self.reason = reason
        self.code = code


class InvalidArgument(LockdError, ValueError):
    """INVALID_ARGUMENT: the request is wrong; ``field`` names the field when known."""

    def __init__(self, message: str = "", reason: str = "", code=None, field: str = ""):
        super().__init__(message, reason, code)
        self.field = field


class LimitMismatch(InvalidArgument):
    """LIMIT_MISMATCH: the acquire's limit or mode disagrees with the key's holders and waiters."""


class SessionDead(LockdError):
    """SESSION_DEAD: the session is unknown, expired, lost or closed. Terminal."""


class SessionExpired(SessionDead):
    """The session's local deadline passed without an answer extending it."""


class NotOwner(LockdError):
    """NOT_OWNER: a release or set_value named a grant that is not the key's current one."""


class PermissionDenied(LockdError):
    """ACCESS_DENIED or a refused session secret or principal (SESSION_SECRET_*, SESSION_PRINCIPAL_MISMATCH)."""


class Unauthenticated(PermissionDenied):
    """UNAUTHENTICATED: the caller's credentials (bearer token, certificate) were refused."""


class Unavailable(LockdError):
    """UNAVAILABLE, CONTENTION, NOT_LEADER: retryable; raised once the call's time ran out."""

    retryable = True


class ShuttingDown(Unavailable):
    """SHUTTING_DOWN: the replica is stopping; retried on another address."""


class WaitTimeout(LockdError, TimeoutError):
    """WAIT_TIMEOUT: an acquire's timeout ran out before the grant."""


class DeadlineExceeded(LockdError, TimeoutError):
    """The call's own time (``timeout``) ran out."""


class Cancelled(LockdError):
    """The caller cancelled the call (a :class:`lockd.Cancel`)."""


class LimitReached(LockdError):
    """LIMIT: a server limit was reached (docs/contracts/C2.md #ct2-limits); ``limit`` names it."""

    def __init__(self, message: str = "", reason: str = "", code=None, limit: str = ""):
        super().__init__(message, reason, code)
        self.limit = limit


class Deadlock(LockdError):
    """DEADLOCK: the acquire's wait closed a cycle of waiting sessions and was refused
    (docs/contracts/C2.md #ct2-deadlock). Never retried (its code, ABORTED, otherwise is);
    ``keys`` are the cycle's keys, sorted. The session keeps its other locks."""

    def __init__(self, message: str = "", reason: str = "", code=None, keys: list[str] | None = None):
        super().__init__(message, reason, code)
        self.keys = keys or []


class Internal(LockdError):
    """INTERNAL or an unknown code: the server failed; details are in its log."""


class Locked(LockdError):
    """try_acquire found the key held (or waited for) by another session."""


class LockLost(LockdError):
    """The lock is no longer trusted: revoked, expired, not confirmed, or its session ended."""


class MaxHold(LockLost):
    """The server revoked the lock because it was held longer than its max_hold."""


class Released(LockdError):
    """The lock was released by its holder."""


class Closed(LockdError):
    """The session or client was closed by its owner."""


_BY_REASON = {
    "INVALID_ARGUMENT": InvalidArgument,
    "LIMIT_MISMATCH": LimitMismatch,
    "SESSION_DEAD": SessionDead,
    "NOT_OWNER": NotOwner,
    "CONTENTION": Unavailable,
    "NOT_LEADER": Unavailable,
    "UNAVAILABLE": Unavailable,
    "SHUTTING_DOWN": ShuttingDown,
    "WAIT_TIMEOUT": WaitTimeout,
    "LIMIT": LimitReached,
    "SESSION_SECRET_REQUIRED": PermissionDenied,
    "SESSION_SECRET_MISMATCH": PermissionDenied,
    "SESSION_PRINCIPAL_MISMATCH": PermissionDenied,
    "ACCESS_DENIED": PermissionDenied,
    "UNAUTHENTICATED": Unauthenticated,
    "INTERNAL": Internal,
    "DEADLOCK": Deadlock,
}

_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: SessionDead,
    # A reason-less PERMISSION_DENIED (an older server) is NOT_OWNER.
    grpc.StatusCode.PERMISSION_DENIED: NotOwner,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.ABORTED: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitReached,
}


def from_code(code: grpc.StatusCode | None, reason: str, message: str, field: str = "",
              limit: str = "", keys: str = "") -> LockdError:
    """Maps a status (code, ErrorInfo reason, message) to an exception."""
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, Internal)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and reason != "WAIT_TIMEOUT":
        cls = DeadlineExceeded
    if cls is InvalidArgument or cls is LimitMismatch:
        return cls(message, reason, code, field=field)
    if cls is LimitReached:
        return cls(message, reason, code, limit=limit)
    if cls is Deadlock:
        try:
            decoded = json.loads(keys) if keys else []
        except ValueError:
            decoded = []
        return cls(message, reason, code, keys=[k for k in decoded if isinstance(k, str)] if isinstance(decoded, list) else [])
    return cls(message, reason, code)


def from_rpc(err: grpc.RpcError) -> LockdError:
    """Maps a failed gRPC call to an exception."""
    code = err.code() if hasattr(err, "code") else None
    message = err.details() if hasattr(err, "details") else str(err)
    reason, field, limit, keys = "", "", "", ""
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for k, v in trailers or ():
        if k == "grpc-status-details-bin":
            info = _status.decode(v, DOMAIN)
            reason, field, limit, keys = info.reason, info.field, info.limit, info.keys
            if field:
                message = f"{field}: {info.description}"
    return from_code(code, reason, message or "", field, limit, keys)


# Codes of google.rpc.Code as KeepAliveResponse.error carries them.
_RPC_CODES = {c.value[0]: c for c in grpc.StatusCode}


def from_session_error(code: int, reason: str, message: str) -> LockdError:
    """Maps the per-session error of a heartbeat answer."""
    return from_code(_RPC_CODES.get(code), reason, message)
