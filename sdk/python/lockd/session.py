"""Sessions and locks: the trust rules of docs/contracts/C2.md #ct2-sdk.

A session is trusted until its deadline: the client's monotonic time when it
SENT the latest acknowledged request, plus the Remaining of the reply, minus
the safety margin. A lock is trusted until the earlier of the session's
deadline and its own, which only its grant reply and heartbeat answers that
list it move. At a deadline, or when the server says the lock or session is
gone, trust ends: the ``lost`` Event is set, callbacks run and ``valid()``
turns False.
"""

from __future__ import annotations

import logging
import math
import os
import threading

from . import errors
from ._acquire import AcquireMixin
from ._acquire_all import AcquireAllMixin
from ._cancel import Cancel
from .client import CLOSE_TIMEOUT, check_timing
from .lock import Lock, _Trust
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

MAX_LOST_KEYS = 4096


def trust_from(sent: float, _arrived: float) -> float:
    """The instant a reply's Remaining counts from: the send time of the
    request it answers, never its arrival (C2 #ct2-deadline)."""
    return sent


def _trust_from_arrival(_sent: float, arrived: float) -> float:
    """The receive-time control: counts Remaining from the reply's arrival,
    which adds the reply's transit to the client's trust. Never in use
    unless LOCKD_PYSDK_CONTROL=recvtime (like the Go SDK's
    lockd_recvtime_control build tag): the tests must catch it."""
    return arrived


if os.environ.get("LOCKD_PYSDK_CONTROL") == "recvtime":
    trust_from = _trust_from_arrival  # noqa: F811  (the control, on purpose)
    logging.getLogger("lockd").warning("LOCKD_PYSDK_CONTROL=recvtime: this SDK breaks the send-time rule on purpose "
                                       "(a test control); never use it for real locks")


def _unconfirmed(l: Lock, now: float, why: str) -> errors.LockLost:
    """The error of a lock no answer confirms any more, found at now (client
    clock): MaxHold once its max_hold may have run out, else LockLost (C2
    #ct2-maxhold-sdk). The Acquire's send time plus max_hold is a lower bound
    of the hold's end on the server, so before it the hold cannot be why. A
    notice that comes later changes nothing: a lock keeps its first error."""
    if now >= l._max_hold_at:
        return errors.MaxHold(f"lock {l.key!r} {why} after its max_hold")
    return errors.LockLost(f"lock {l.key!r} {why}")


class Session(AcquireMixin, AcquireAllMixin, _Trust):
    """A lockd session: the unit of liveness locks live in. Use it as a
    context manager (closed on exit) or call close()."""

    def __init__(self, c, sid: str, secret: bytes, ttl: float, margin: float, interval: float, lock_delay: float):
        super().__init__()
        self.c = c
        self.id = sid
        self._secret = secret  # proves ownership (C2 #ct2-ownership); never shown
        self.ttl, self.margin, self.interval = ttl, margin, interval
        self.lock_delay = lock_delay
        self.mu = threading.RLock()
        self._deadline = 0.0
        self._timer = None
        self._timer_at = math.inf
        self.locks: dict[str, Lock] = {}
        self.lock_seq = 0
        self.lost_tok: dict[str, int] = {}
        self.acks: list[int] = []
        self.ack_gen = 0
        self.busy: dict[str, int] = {}
        self._closed_ok = False
        self._ended = Cancel()  # cancelled when trust ends: ends waits of the session

    def __repr__(self) -> str:
        return f"lockd.Session({self.id})"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- opening --------------------------------------------------------

    @classmethod
    def _open(cls, c, ttl: float, owner: str, labels: dict, lock_delay: float, timeout) -> "Session":
        req = cls._open_request(c, ttl, owner, labels, lock_delay)
        resp, sent = c._call("OpenSession", req, timeout=timeout if timeout is not None else -1.0)
        return cls._opened(c, resp, sent, lock_delay)

    @staticmethod
    def _open_request(c, ttl: float, owner: str, labels: dict, lock_delay: float) -> pb.OpenSessionRequest:
        """The OpenSession request, after the checks that need no answer (lockd.aio's too)."""
        if ttl < 0 or abs(round(ttl * 1000) - ttl * 1000) > 1e-6:
            raise errors.InvalidArgument(f"ttl: {ttl} is negative or not whole milliseconds", field="ttl")
        if lock_delay < 0:
            raise errors.InvalidArgument("lock_delay: negative", field="lock_delay")
        check_timing(ttl, c.safety_margin, c.heartbeat_interval)
        return pb.OpenSessionRequest(ttl_ms=round(ttl * 1000), owner=owner, labels=labels)

    @classmethod
    def _opened(cls, c, resp, sent: float, lock_delay: float) -> "Session":
        """The session of an OpenSession answer to a request sent at sent:
        rule 2's checks (a refused session is abandoned), the deadline from
        the send time, the deadline timer, the keepalive (lockd.aio's too)."""
        s = cls(c, resp.session_id, resp.session_secret, resp.ttl_ms / 1000.0, resp.safety_margin_ms / 1000.0,
                resp.heartbeat_interval_ms / 1000.0, lock_delay)
        if c.safety_margin > 0:
            s.margin = c.safety_margin
        if s.interval <= 0:
            s.interval = s.ttl / 3
        try:
            if s.margin <= 0 or s.ttl <= 0:
                raise errors.InvalidArgument(f"safety margin {s.margin}s must be > 0 and < ttl/2 (ttl {s.ttl}s)")
            if c.heartbeat_interval > 0:
                s.interval = c.heartbeat_interval
                check_timing(s.ttl, s.margin, s.interval)
            else:
                check_timing(s.ttl, s.margin, 0)
                if s.interval >= s.ttl - s.margin:
                    raise errors.InvalidArgument(
                        f"the server's heartbeat interval {s.interval}s must be below ttl - safety margin")
        except errors.InvalidArgument:
            s._abandon()
            raise
        s._deadline = trust_from(sent, c.clock.now()) + resp.remaining_ms / 1000.0 - s.margin
        if c.clock.now() >= s._deadline:
            s._abandon()
            raise errors.SessionExpired("session expired before its open answer arrived")
        with s.mu:
            s._arm()
        c.ka.add(s)
        return s

    # --- trust ----------------------------------------------------------

    @property
    def deadline(self) -> float:
        """The instant (client clock, seconds) the session stops being trusted unless an answer extends it."""
        with self.mu:
            return self._deadline

    def valid(self) -> bool:
        """Whether the session is trusted now: not ended and its deadline not passed."""
        with self.mu:
            return self._err is None and self.c.clock.now() < self._deadline

    def _earliest(self) -> float:
        at = self._deadline
        for l in self.locks.values():
            at = min(at, l._deadline)
        return at

    def earliest_deadline(self):
        """The earliest of the session's and its locks' deadlines (monotonic
        clock): the heartbeat schedule sends halfway to it (C2 #ct2-deadline);
        None once the session ended."""
        with self.mu:
            if self._err is not None:
                return None
            return self._earliest()

    def _arm(self) -> None:
        """(Re)arms the deadline timer at the earliest deadline (mu held)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = self._earliest()
        self._timer = self.c.timers.at(self._timer_at, self._deadline_reached)

    def _deadline_reached(self) -> None:
        lost = []
        with self.mu:
            if self._err is not None:
                return
            now = self.c.clock.now()
            if now >= self._deadline:
                expired = True
            else:
                expired = False
                for key, l in list(self.locks.items()):
                    if now >= l._deadline:
                        del self.locks[key]
                        lost.append(l)
                self._arm()
        if expired:
            self._end(errors.SessionExpired("session expired: its deadline passed without an answer"))
            return
        for l in lost:
            l._end_trust(_unconfirmed(l, now, "not confirmed by the server before its deadline"))

    def _extend(self, sent: float, remaining: float) -> float:
        """Applies a grant reply: the session's deadline moves to the later of
        it and sent + remaining - margin (locks are not extended)."""
        d = trust_from(sent, self.c.clock.now()) + remaining - self.margin
        with self.mu:
            if self._err is not None:
                return d
            if self.c.clock.now() >= self._deadline:
                expired = True
            else:
                expired = False
                self._deadline = max(self._deadline, d)
        if expired:
            self._end(errors.SessionExpired("session expired"))
        return d

    def _answer(self, sent: float, seq: int, live: bool, remaining: float, held) -> None:
        """Applies a heartbeat answer to a request sent at sent when lock_seq
        was seq (C2 #ct2-confirm, #ct2-sdk rule 5)."""
        lost, orphans = [], []
        with self.mu:
            if self._err is not None:
                return
            now = self.c.clock.now()
            if live and now >= self._deadline:
                expired = True
            else:
                expired = False
                listed = None if held is None else {h.key: h.token for h in held.locks}
                d = trust_from(sent, now) + remaining - self.margin
                for key, l in list(self.locks.items()):
                    if listed is None or listed.get(key) == l.token:
                        if live and d > l._deadline:
                            l._deadline = d
                        continue
                    if l.seq <= seq:
                        del self.locks[key]
                        self._fence(key, l.token)
                        lost.append(l)
                if live and d > self._deadline:
                    self._deadline = d
                # Grants no lock and no call under way knows: a kept place
                # handed the key after its caller gave up (rule 7).
                if held is not None:
                    for h in held.locks:
                        if h.key not in self.locks and not self.busy.get(h.key) and h.token > self.lost_tok.get(h.key, 0):
                            orphans.append((h.key, h.token))
                            self._fence(h.key, h.token)
        if expired:
            self._end(errors.SessionExpired("session expired"))
            return
        for l in lost:
            l._end_trust(_unconfirmed(l, now, "not confirmed by the server"))
        for key, token in orphans:
            self._release_orphan(key, token)

    def _fence(self, key: str, token: int) -> None:
        if token <= self.lost_tok.get(key, 0):
            return
        if len(self.lost_tok) >= MAX_LOST_KEYS:
            self.lost_tok = {}
        self.lost_tok[key] = token

    def _lock_lost(self, n, gen: int) -> bool:
        """Applies a lock-lost notice and queues its ack for the stream numbered
        gen it came on (0: none); returns whether one was queued."""
        ack = False
        with self.mu:
            if self._err is not None:
                return False
            if n.notice_id and gen:
                if self.ack_gen != gen:
                    self.acks, self.ack_gen = [], gen
                self.acks.append(n.notice_id)
                ack = True
            self._fence(n.key, n.token)
            l = self.locks.get(n.key)
            if l is None or l.token > n.token:
                return ack
            del self.locks[n.key]
        if n.reason == pb.LOCK_LOST_REASON_MAX_HOLD:
            l._end_trust(errors.MaxHold(f"lock {n.key!r} held longer than its max_hold: revoked by the server"))
        else:
            why = {pb.LOCK_LOST_REASON_REVOKED: "revoked", pb.LOCK_LOST_REASON_EXPIRED: "expired",
                   pb.LOCK_LOST_REASON_SERVER_SHUTDOWN: "server shutting down"}.get(n.reason, "gone")
            l._end_trust(errors.LockLost(f"lock {n.key!r} lost: {why}"))
        return ack

    def _beat_state(self, gen: int):
        """(lock_seq, acks) for a heartbeat about to be sent on stream gen."""
        with self.mu:
            acks = self.acks if self.ack_gen == gen else []
            self.acks = []
            return self.lock_seq, acks

    def _beat_seq(self) -> int:
        """lock_seq for a heartbeat that carries no acknowledgements (a stalled stream's)."""
        with self.mu:
            return self.lock_seq

    def _busy(self, key: str):
        with self.mu:
            self.busy[key] = self.busy.get(key, 0) + 1

        def done():
            with self.mu:
                self.busy[key] -= 1
                if self.busy[key] <= 0:
                    del self.busy[key]
        return done

    def _release_orphan(self, key: str, token: int) -> None:
        req = pb.ReleaseRequest(session_id=self.id, session_secret=self._secret, key=key, token=token)

        def run():
            try:
                self.c._call("Release", req, timeout=CLOSE_TIMEOUT, cancel=self._ended)
                log.debug("released a grant no lock knew: %s token %d", key, token)
            except errors.LockdError as e:
                log.debug("releasing a grant no lock knew failed: %s", e)
        self.c._spawn(run, "lockd-orphan")

    # --- ending ---------------------------------------------------------

    def _end(self, err: errors.LockdError) -> None:
        with self.mu:
            cbs = self._mark(err)
            if cbs is None:
                return
            if self._timer is not None:
                self._timer.cancel()
            locks, self.locks = self.locks, {}
        self._fire(err, cbs)
        self._ended.cancel()
        for l in locks.values():
            l._end_trust(err)
        self.c.ka.remove(self)
        log.debug("session ended: %s", err)
        if isinstance(err, errors.SessionExpired):
            self._abandon()

    def _abandon(self) -> None:
        """Closes the session on the server in the background, best effort."""
        req = pb.CloseSessionRequest(session_id=self.id, session_secret=self._secret)

        def run():
            try:
                self.c._call("CloseSession", req, timeout=CLOSE_TIMEOUT)
            except errors.LockdError:
                pass
        self.c._spawn(run, "lockd-abandon")

    def close(self, timeout: float | None = -1.0) -> None:
        """Ends the session (every lock is lost at once) and closes it on the
        server, releasing its locks. Retries until timeout."""
        self._end(errors.Closed("session closed"))
        with self.mu:
            dead = isinstance(self._err, errors.SessionDead) and not isinstance(self._err, errors.SessionExpired)
            if dead or self._closed_ok:
                return
        self.c._call("CloseSession", pb.CloseSessionRequest(session_id=self.id, session_secret=self._secret),
                     timeout=timeout)
        with self.mu:
            self._closed_ok = True

    def _close_quietly(self, timeout: float) -> None:
        try:
            self.close(timeout)
        except errors.LockdError:
            pass

    def _check_server_err(self, err: errors.LockdError) -> None:
        if isinstance(err, errors.SessionDead) and not isinstance(err, errors.SessionExpired):
            self._end(err)


__all__ = ["Session", "Lock"]
