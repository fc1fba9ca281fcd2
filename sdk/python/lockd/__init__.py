"""lockd: the Python SDK of lockd, a distributed lock service.

    import lockd

    with lockd.Client("127.0.0.1:7420") as c, c.session(ttl=15) as s:
        with s.acquire("jobs/nightly", timeout=30) as lock:
            do_work(fencing_token=lock.token)   # pass the token to the resource
            if not lock.valid():                # or wait on lock.lost
                raise SystemExit("lost the lock")

Sessions are kept alive by a background thread of the Client; the timing
rules (deadline from the send time minus the safety margin, the heartbeat
schedule, lock confirmation by held sets, notice acks) are those of
docs/contracts/C2.md #ct2-sdk. An asyncio API is :mod:`lockd.aio`.
"""

from ._cancel import Cancel
from ._clock import Clock, FakeClock
from ._conn import TLS
from ._hotkeys import HotKey, HotKeys
from ._types import Event, EventKind, HolderInfo, LockInfo, Observation, TokenCheck, WaitEstimate
from .client import Client, check_timing
from .election import Leadership, Observer
from .errors import (Cancelled, Closed, Deadlock, DeadlineExceeded, Internal, InvalidArgument, LimitMismatch, LimitReached,
                     Locked, LockdError, LockLost, MaxHold, NotOwner, PermissionDenied, Released, SessionDead,
                     SessionExpired, ShuttingDown, Unauthenticated, Unavailable, WaitTimeout)
from .lock import Lock
from .session import Session
from .watch import Watch
from ._wait_updates import WaitUpdate
from . import aio  # noqa: E402  (after the sync API it wraps)

__version__ = "0.1.0"

__all__ = [
    "Cancel", "Clock", "FakeClock", "TLS", "HotKey", "HotKeys", "Event", "EventKind", "HolderInfo", "LockInfo", "WaitEstimate", "WaitUpdate", "Observation", "TokenCheck", "Client",
    "check_timing", "Leadership", "Observer", "Lock", "Session", "Watch", "Cancelled", "Closed", "Deadlock", "DeadlineExceeded",
    "Internal", "InvalidArgument", "LimitMismatch", "LimitReached", "Locked", "LockdError", "LockLost", "MaxHold",
    "NotOwner", "PermissionDenied", "Released", "SessionDead", "SessionExpired", "ShuttingDown", "Unauthenticated",
    "Unavailable", "WaitTimeout",
]
