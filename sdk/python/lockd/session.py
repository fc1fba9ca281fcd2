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
import threading

from . import errors
from ._cancel import Cancel, link
from .client import CLOSE_TIMEOUT, check_timing, validate_key
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

MAX_LOST_KEYS = 4096
MAX_VALUE = 4096


def trust_from(sent: float, _arrived: float) -> float:
    """The instant a reply's Remaining counts from: the send time of the
    request it answers, never its arrival (C2 #ct2-deadline). Tests swap it to
    show that they catch a receive-time SDK."""
    return sent


class _Trust:
    """What ends trust: an Event, callbacks and the error, shared by Session and Lock."""

    def __init__(self) -> None:
        self.lost = threading.Event()
        self._cbs: list = []
        self._err: errors.LockdError | None = None
        self._tmu = threading.Lock()

    @property
    def error(self) -> errors.LockdError | None:
        """None while trusted; afterwards why not."""
        with self._tmu:
            return self._err

    def on_lost(self, fn) -> None:
        """Calls fn(error) when trust ends (at once if it has). fn runs on an SDK thread: keep it short."""
        with self._tmu:
            if self._err is None:
                self._cbs.append(fn)
                return
            err = self._err
        fn(err)

    def _mark(self, err: errors.LockdError):
        """Records the end of trust; returns the callbacks to fire, None if it had ended."""
        with self._tmu:
            if self._err is not None:
                return None
            self._err = err
            cbs, self._cbs = self._cbs, []
        self.lost.set()
        return cbs

    def _fire(self, err: errors.LockdError, cbs) -> None:
        for fn in cbs or ():
            try:
                fn(err)
            except Exception:
                log.exception("lockd: on_lost callback failed")

    def _end_trust(self, err: errors.LockdError) -> bool:
        cbs = self._mark(err)
        self._fire(err, cbs)
        return cbs is not None


class Session(_Trust):
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
        if ttl < 0 or abs(round(ttl * 1000) - ttl * 1000) > 1e-6:
            raise errors.InvalidArgument(f"ttl: {ttl} is negative or not whole milliseconds", field="ttl")
        if lock_delay < 0:
            raise errors.InvalidArgument("lock_delay: negative", field="lock_delay")
        check_timing(ttl, c.safety_margin, c.heartbeat_interval)
        req = pb.OpenSessionRequest(ttl_ms=round(ttl * 1000), owner=owner, labels=labels)
        resp, sent = c._call("OpenSession", req, timeout=timeout if timeout is not None else -1.0)
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
            l._end_trust(errors.LockLost(f"lock {l.key!r} not confirmed by the server before its deadline"))

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
            l._end_trust(errors.LockLost(f"lock {l.key!r} not confirmed by the server"))
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

    # --- acquiring ------------------------------------------------------

    def _request(self, key, value, limit, shared, exclusive, lock_delay, max_hold, wait) -> pb.AcquireRequest:
        validate_key(key)
        value = bytes(value or b"")
        if len(value) > MAX_VALUE:
            raise errors.InvalidArgument(f"value: {len(value)} bytes, at most {MAX_VALUE}", field="value")
        if shared and exclusive:
            raise errors.InvalidArgument("give shared or exclusive, not both", field="mode")
        mode = pb.LOCK_MODE_SHARED if shared else pb.LOCK_MODE_EXCLUSIVE if exclusive else pb.LOCK_MODE_UNSPECIFIED
        if not 0 <= limit <= 1024:
            raise errors.InvalidArgument(f"limit: {limit}, want 0..1024", field="limit")
        multi = limit > 1 or mode != pb.LOCK_MODE_UNSPECIFIED
        if mode != pb.LOCK_MODE_UNSPECIFIED and limit > 1:
            raise errors.InvalidArgument("limit: shared and exclusive take no limit", field="limit")
        if multi and lock_delay:
            raise errors.InvalidArgument("lock_delay: only for plain locks", field="lock_delay")
        if multi and max_hold:
            raise errors.InvalidArgument("max_hold: only for plain locks", field="max_hold")
        delay = lock_delay if lock_delay is not None else (0 if multi else self.lock_delay)
        if delay < 0 or (max_hold or 0) < 0:
            raise errors.InvalidArgument("lock_delay and max_hold must not be negative", field="lock_delay")
        return pb.AcquireRequest(session_id=self.id, session_secret=self._secret, key=key, wait=wait, value=value,
                                 limit=limit, mode=mode, keep_place=wait, lock_delay_ms=round(delay * 1000),
                                 max_hold_ms=round((max_hold or 0) * 1000))

    def acquire(self, key: str, timeout: float | None = None, cancel: Cancel | None = None, *, value: bytes = b"",
                limit: int = 0, shared: bool = False, exclusive: bool = False, lock_delay: float | None = None,
                max_hold: float | None = None) -> "Lock":
        """Takes the lock named key, waiting in the key's FIFO queue until it
        is granted, ``timeout`` seconds pass (:class:`lockd.WaitTimeout`),
        ``cancel`` fires (:class:`lockd.Cancelled`) or the session ends.
        ``limit`` makes the key a semaphore of N; ``shared``/``exclusive`` a
        read/write lock; ``lock_delay``/``max_hold`` (seconds) plain locks
        only. The place in the queue survives retries and replica moves; when
        acquire gives up it is left (LeaveQueue)."""
        req = self._request(key, value, limit, shared, exclusive, lock_delay, max_hold, True)
        if timeout is not None:
            if timeout < 0:
                raise errors.InvalidArgument("timeout: negative", field="timeout")
            req.wait_timeout_ms = max(1, math.ceil(timeout * 1000))
        try:
            return self._acquire(req, until_cancel=timeout is None, cancel=cancel)
        except (errors.InvalidArgument, errors.PermissionDenied):
            raise
        except errors.LockdError:
            if self.error is None:
                self._leave_queue(key)
            raise

    def try_acquire(self, key: str, *, value: bytes = b"", limit: int = 0, shared: bool = False,
                    exclusive: bool = False, lock_delay: float | None = None, max_hold: float | None = None,
                    timeout: float | None = -1.0) -> "Lock":
        """Takes the lock if it is free and nobody waits; else raises :class:`lockd.Locked` naming the holder."""
        req = self._request(key, value, limit, shared, exclusive, lock_delay, max_hold, False)
        try:
            return self._acquire(req, until_cancel=False, cancel=None, timeout=timeout)
        except errors.Locked:
            try:
                info = self.c.inspect(key, timeout=1.0)
            except errors.LockdError:
                raise errors.Locked(f"{key!r} is locked") from None
            if not info.held:
                raise
            raise errors.Locked(f"{key!r} is locked by {info.holder()}") from None

    def _leave_queue(self, key: str) -> None:
        req = pb.LeaveQueueRequest(session_id=self.id, session_secret=self._secret, key=key)

        def run():
            try:
                self.c._call("LeaveQueue", req, timeout=None, cancel=self._ended)
            except errors.LockdError as e:
                log.debug("leaving the queue of %r failed: %s", key, e)
        self.c._spawn(run, "lockd-leave")

    def _acquire(self, req, until_cancel: bool, cancel: Cancel | None, timeout: float | None = None) -> "Lock":
        if self.error is not None:
            raise self.error
        done = self._busy(req.key)
        both, unlink = link(cancel, self._ended)
        try:
            while True:
                try:
                    resp, sent = self.c._call("Acquire", req, timeout=timeout, cancel=both)
                    break
                except errors.WaitTimeout:
                    if until_cancel:
                        continue  # the server's maximum wait: the place is kept, ask again
                    raise
                except errors.Cancelled:
                    if self.error is not None and not (cancel is not None and cancel.cancelled):
                        raise self.error from None
                    raise
                except errors.LockdError as e:
                    self._check_server_err(e)
                    raise
            if not resp.granted:
                raise errors.Locked(f"{req.key!r} is locked")
            d = self._extend(sent, resp.remaining_ms / 1000.0)
            return self._add_lock(req.key, resp.token, d)
        finally:
            unlink()
            done()

    def _add_lock(self, key: str, token: int, deadline: float) -> "Lock":
        with self.mu:
            if self._err is not None:
                raise self._err
            deadline = max(deadline, self._deadline)
            if token <= self.lost_tok.get(key, 0):
                raise errors.LockLost(f"lock {key!r} lost before its grant reply arrived")
            l = self.locks.get(key)
            if l is not None and l.token == token:
                l._deadline = max(l._deadline, deadline)
                return l
            self.lock_seq += 1
            l = Lock(self, key, token, self.lock_seq, deadline)
            self.locks[key] = l
            if deadline < self._timer_at:
                self._arm()
            return l

    def campaign(self, name: str, value: bytes = b"", timeout: float | None = None, cancel: Cancel | None = None):
        """Waits in election name's FIFO queue until this session leads it;
        value is published with the leadership (docs/contracts/C2.md
        #ct2-election). Returns a :class:`lockd.Leadership`."""
        from .election import Leadership
        l = self.acquire(name, timeout=timeout, cancel=cancel, value=value)
        return Leadership(l, bytes(value))


class Lock(_Trust):
    """A granted lock, trusted until ``lost`` is set. A context manager that
    releases it on exit. Pass ``token`` to the resource it protects."""

    def __init__(self, s: Session, key: str, token: int, seq: int, deadline: float):
        super().__init__()
        self.session = s
        self.key = key
        self.token = token
        self.seq = seq
        self._deadline = deadline  # under s.mu
        self._ambiguous = False
        self._released_ok = False

    def __repr__(self) -> str:
        return f"lockd.Lock({self.key!r}, token={self.token})"

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.release()
        except errors.NotOwner:
            pass  # the lock was lost before: nothing of ours to release

    @property
    def deadline(self) -> float:
        """The earlier of the lock's own deadline and its session's (client clock)."""
        with self.session.mu:
            return min(self._deadline, self.session._deadline)

    def valid(self) -> bool:
        """Whether the lock is trusted now: not lost and the monotonic clock before its deadline."""
        with self.session.mu:
            return self.error is None and self.session.c.clock.now() < min(self._deadline, self.session._deadline)

    def set_value(self, value: bytes, timeout: float | None = -1.0) -> None:
        """Replaces the grant's value (token unchanged); LockLost once the lock is not trusted."""
        value = bytes(value)
        if len(value) > MAX_VALUE:
            raise errors.InvalidArgument(f"value: {len(value)} bytes, at most {MAX_VALUE}", field="value")
        if self.error is not None:
            raise errors.LockLost(f"set value of {self.key!r}: {self.error}")
        s = self.session
        s.c._call("SetValue", pb.SetValueRequest(session_id=s.id, session_secret=s._secret, key=self.key,
                                                 token=self.token, value=value), timeout=timeout)

    def release(self, timeout: float | None = -1.0) -> None:
        """Stops trusting the lock, then deletes the grant on the server,
        fenced by its token. Safe to retry; NotOwner when the lock had been
        lost before."""
        lost_before = self.error
        if isinstance(lost_before, errors.Released):
            lost_before = None
        s = self.session
        done = s._busy(self.key)
        try:
            with s.mu:
                if s.locks.get(self.key) is self:
                    del s.locks[self.key]
            self._end_trust(errors.Released(f"lock {self.key!r} released"))
            if self._released_ok:
                return
            req = pb.ReleaseRequest(session_id=s.id, session_secret=s._secret, key=self.key, token=self.token)

            def seen(err):
                if err.retryable:
                    self._ambiguous = True  # an attempt may have taken effect
            try:
                s.c._call("Release", req, timeout=timeout, on_error=seen)
                self._released_ok = True
            except errors.NotOwner:
                if self._ambiguous and lost_before is None:
                    self._released_ok = True
                    return
                raise
        finally:
            done()
