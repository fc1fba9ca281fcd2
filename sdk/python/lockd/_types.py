"""Plain data the SDK returns: key descriptions, watch events, observations."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .v1 import lockd_pb2 as pb


@dataclass
class HolderInfo:
    """One holder of a semaphore or read/write key."""
    session: str
    token: int
    mode: str = ""  # "shared", "exclusive" or "" (a semaphore slot)
    owner: str = ""
    labels: dict = field(default_factory=dict)
    value: bytes = b""
    acquired_at: float | None = None  # the backend's wall clock, seconds since the epoch; display only


@dataclass
class WaitEstimate:
    """One waiter's estimated wait (C2 #ct2-wait-estimate): ``position`` 1 is
    next in line, ``wait`` about how many seconds from inspect's answer until
    its grant. Never a promise."""
    session: str
    position: int
    wait: float


@dataclass
class LockInfo:
    """A key as Inspect and List describe it. ``held`` False: nobody holds it
    (``delay_remaining`` says how long a lock-delay still keeps it)."""
    key: str
    held: bool = False
    session: str = ""
    token: int = 0
    waiters: list = field(default_factory=list)
    owner: str = ""
    labels: dict = field(default_factory=dict)
    value: bytes = b""
    holders: list = field(default_factory=list)
    limit: int = 0
    lock_delay: float = 0.0
    delay_remaining: float = 0.0
    acquired_at: float | None = None
    # inspect only: each waiter's estimate in queue order; empty when the
    # server knows none (C2 #ct2-wait-estimate).
    wait_estimates: list = field(default_factory=list)

    def holder(self) -> str:
        """The holder for people: its owner, else its session, and the token."""
        who = repr(self.owner) if self.owner else "session " + self.session
        return f"{who} token {self.token}"


_MODES = {pb.LOCK_MODE_SHARED: "shared", pb.LOCK_MODE_EXCLUSIVE: "exclusive"}


def _ts(t) -> float | None:
    if t is None or (t.seconds == 0 and t.nanos == 0):
        return None
    return t.seconds + t.nanos / 1e9


def lock_info(p) -> LockInfo:
    info = LockInfo(key=p.key, held=True, session=p.session_id, token=p.token, waiters=list(p.waiters),
                    owner=p.owner, labels=dict(p.labels), value=bytes(p.value), limit=p.limit,
                    lock_delay=p.lock_delay_ms / 1000.0,
                    acquired_at=_ts(p.acquired_at) if p.HasField("acquired_at") else None)
    for h in p.holders:
        info.holders.append(HolderInfo(session=h.session_id, token=h.token, mode=_MODES.get(h.mode, ""),
                                       owner=h.owner, labels=dict(h.labels), value=bytes(h.value),
                                       acquired_at=_ts(h.acquired_at) if h.HasField("acquired_at") else None))
    for e in p.wait_estimates:
        info.wait_estimates.append(WaitEstimate(session=e.session_id, position=e.position, wait=e.estimate_ms / 1000.0))
    return info


@dataclass
class TokenCheck:
    """What :meth:`lockd.Client.check_token` answers (C2 #ct2-check-token):
    ``current`` when a grant of the key with the checked token is held;
    ``tokens`` the key's current grants' tokens, lowest first (empty: nobody
    holds it); ``cached`` when the server's index answered rather than the
    backend."""
    current: bool = False
    tokens: list[int] = field(default_factory=list)
    cached: bool = False


class EventKind(enum.IntEnum):
    """What happened to a key (the proto's EventKind numbers)."""
    ACQUIRED = 1
    RELEASED = 2
    EXPIRED = 3
    REVOKED = 4
    VALUE = 5
    MAX_HOLD = 6
    RESYNC = 7

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class Event:
    """One change to a key. RESYNC: the watch resumed where the server could
    not tell what happened meanwhile; re-read what you follow."""
    kind: EventKind
    key: str = ""
    session: str = ""
    token: int = 0
    owner: str = ""
    labels: dict = field(default_factory=dict)
    value: bytes = b""
    cursor: str = ""


@dataclass
class Observation:
    """An election's leader (``leader`` False: none) as Observe reports it."""
    name: str
    leader: bool = False
    session: str = ""
    token: int = 0
    owner: str = ""
    labels: dict = field(default_factory=dict)
    value: bytes = b""
