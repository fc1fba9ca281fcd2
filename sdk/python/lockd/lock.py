"""Locks: trusted until their deadline or the server says they are gone
(docs/contracts/C2.md #ct2-sdk rules 3 and 5)."""

from __future__ import annotations

import logging
import math
import threading

from . import errors
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

MAX_VALUE = 4096


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
        """Calls fn(error) when trust ends (at once if it has). fn runs on an SDK
        thread (the keepalive receiver or the timer thread): keep it short,
        never block in it and never close the client from it. ``lost`` is
        set before the callbacks run."""
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


class Lock(_Trust):
    """A granted lock, trusted until ``lost`` is set. A context manager that
    releases it on exit. Pass ``token`` to the resource it protects."""

    def __init__(self, s: Session, key: str, token: int, seq: int, deadline: float, max_hold_at: float = math.inf):
        super().__init__()
        self.session = s
        self.key = key
        self.token = token
        self.seq = seq
        self._deadline = deadline  # under s.mu
        # The Acquire's send time plus the grant's max_hold (inf: none): a
        # lock no answer confirms from then on is MaxHold (C2
        # #ct2-maxhold-sdk). Set here, never changed.
        self._max_hold_at = max_hold_at
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
