"""Acquiring: waits in a key's FIFO queue, tries, semaphores, read/write
locks, lock-delay and max hold, election campaigns (the Session methods)."""

from __future__ import annotations

import logging
import math

from . import errors
from ._cancel import Cancel, link
from ._wait_updates import Updates, check_every
from .client import validate_key
from .lock import MAX_VALUE, Lock
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")


class AcquireMixin:
    """Session's acquire calls (session.py holds its trust state)."""

    _lock_class = Lock  # lockd.aio's sessions make lockd.aio.Lock

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
                max_hold: float | None = None, no_deadlock_check: bool = False, on_wait_update=None,
                wait_update_every: float | None = None) -> "Lock":
        """Takes the lock named key, waiting in the key's FIFO queue until it
        is granted, ``timeout`` seconds pass (:class:`lockd.WaitTimeout`),
        ``cancel`` fires (:class:`lockd.Cancelled`) or the session ends.
        A wait that closes a cycle of waiting sessions raises
        :class:`lockd.Deadlock` (never retried) unless ``no_deadlock_check``
        (docs/contracts/C2.md #ct2-deadlock).
        ``limit`` makes the key a semaphore of N; ``shared``/``exclusive`` a
        read/write lock; ``lock_delay``/``max_hold`` (seconds) plain locks
        only. The place in the queue survives retries and replica moves; when
        acquire gives up it is left (LeaveQueue).

        ``on_wait_update`` (a function of one :class:`lockd.WaitUpdate`)
        reports the wait (C2 #ct2-wait-updates): acquire reads the key with
        Inspect 0.3 s after it starts (or ``wait_update_every``, if shorter),
        then every ``wait_update_every`` seconds (default 1, at least 0.1),
        and calls it with the first answer and whenever the position, queue
        length, estimate, holder or error changed — on one thread acquire
        owns and joins before it returns, so never after. Without it no
        Inspect is sent. The reads need read access to the key: a caller
        who may not read it gets one update with :class:`lockd.PermissionDenied`
        and no more. A function that raises ends the updates (logged at
        debug); nothing about the updates fails the acquire."""
        req = self._request(key, value, limit, shared, exclusive, lock_delay, max_hold, True)
        every = check_every(wait_update_every) if on_wait_update is not None else 0.0
        req.no_deadlock_check = no_deadlock_check
        if timeout is not None:
            if timeout < 0:
                raise errors.InvalidArgument("timeout: negative", field="timeout")
            req.wait_timeout_ms = max(1, math.ceil(timeout * 1000))
        # A wait with a timeout gives up retrying an unreachable server a
        # call_timeout after the wait would have ended.
        bound = None if timeout is None else timeout + self.c.call_timeout
        updates = Updates(self, key, every, on_wait_update) if on_wait_update is not None else None
        try:
            return self._acquire(req, until_cancel=timeout is None, cancel=cancel, timeout=bound,
                                 answered=updates.stop if updates else None)
        except (errors.InvalidArgument, errors.PermissionDenied):
            raise
        except errors.LockdError:
            if self.error is None:
                self._leave_queue(key)
            raise
        finally:
            if updates is not None:
                updates.stop()

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

    def _acquire(self, req, until_cancel: bool, cancel: Cancel | None, timeout: float | None = None,
                 answered=None) -> "Lock":
        def record(resp, sent):
            if answered is not None:
                answered()  # the wait updates end before the grant is recorded
            if not resp.granted:
                raise errors.Locked(f"{req.key!r} is locked")
            d = self._extend(sent, resp.remaining_ms / 1000.0)
            # C2 #ct2-maxhold-sdk: the hold cannot end before sent + max_hold.
            hold_at = sent + req.max_hold_ms / 1000.0 if req.max_hold_ms > 0 else math.inf
            return self._add_lock(req.key, resp.token, d, hold_at)
        return self._send_acquire(req, [req.key], until_cancel, cancel, timeout, record)

    def _send_acquire(self, req, keys, until_cancel: bool, cancel: Cancel | None, timeout: float | None, record):
        """Sends an Acquire of keys (_acquire's one, _acquire_all's several)
        until it is answered, then returns record(resp, sent) while the keys
        are still busy. The session's end also ends the wait; with
        until_cancel a WAIT_TIMEOUT (the server's maximum wait: the places
        are left or kept as C2 says) starts the wait again."""
        if self.error is not None:
            raise self.error
        dones = [self._busy(k) for k in keys]
        both, unlink = link(cancel, self._ended)
        try:
            while True:
                try:
                    resp, sent = self.c._call("Acquire", req, timeout=timeout, cancel=both)
                    break
                except errors.WaitTimeout:
                    if until_cancel:
                        continue
                    raise
                except errors.Cancelled:
                    if self.error is not None and not (cancel is not None and cancel.cancelled):
                        raise self.error from None
                    raise
                except errors.LockdError as e:
                    self._check_server_err(e)
                    raise
            return record(resp, sent)
        finally:
            unlink()
            for done in dones:
                done()

    def _add_lock(self, key: str, token: int, deadline: float, max_hold_at: float = math.inf) -> "Lock":
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
            l = self._lock_class(self, key, token, self.lock_seq, deadline, max_hold_at)
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


