"""Leader election (docs/contracts/C2.md #ct2-election): the exclusive lock
named by the election, nothing more. Candidates queue in FIFO order; the
leader is the holder, its value the grant's value, its token the grant's."""

from __future__ import annotations

from . import errors
from ._cancel import Cancel
from ._types import EventKind, Observation


class Leadership:
    """A won election: trusted until ``lost`` is set (exactly like the lock
    it is). A context manager that resigns on exit."""

    def __init__(self, lock, value: bytes):
        self.lock = lock
        self.value = value

    def __repr__(self) -> str:
        return f"lockd.Leadership({self.name!r}, token={self.token})"

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.resign()
        except errors.NotOwner:
            pass

    @property
    def name(self) -> str:
        return self.lock.key

    @property
    def token(self) -> int:
        """Higher than every earlier leader's: pass it to what the leader writes to."""
        return self.lock.token

    @property
    def lost(self):
        return self.lock.lost

    @property
    def error(self):
        return self.lock.error

    def on_lost(self, fn) -> None:
        """Calls fn(error) when the leadership's trust ends (at once if it
        has), as :meth:`lockd.Lock.on_lost`: fn runs on an SDK thread, so keep
        it short and never block in it."""
        self.lock.on_lost(fn)

    def valid(self) -> bool:
        """Whether the leadership is trusted now: its lock not lost and the
        monotonic clock before the lock's and the session's deadlines. Check
        it (or ``lost``) before acting as the leader."""
        return self.lock.valid()

    def proclaim(self, value: bytes, timeout: float | None = -1.0) -> None:
        """Replaces the published value; the token stays, nobody else gets a turn."""
        try:
            self.lock.set_value(value, timeout=timeout)
        except errors.NotOwner as e:
            raise errors.LockLost(f"proclaim: {e}") from None
        self.value = bytes(value)

    def resign(self, timeout: float | None = -1.0) -> None:
        """Gives up the leadership: the next candidate leads at once."""
        self.lock.release(timeout=timeout)


class Observer:
    """Iterates over the leader of an election as it changes: first the
    current leader (or no leader), then every change, without repeating
    itself. Built on a watch with holders and one inspect after it is
    established (and after every resync); never polls. Ends when ``cancel``
    fires. An observation is what the server said a moment ago: only the
    leader's own Leadership.lost is a safety signal."""

    def __init__(self, c, name: str, cancel: Cancel | None):
        from .client import validate_key
        validate_key(name, "name")
        self.c, self.name, self.cancel = c, name, cancel or Cancel()
        self._watch = c.watch(name, holders=True, cancel=self.cancel)
        self._cur = Observation(name)
        self._last = None
        self._top = 0
        self._gen = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> Observation:
        return next(self._gen)

    def close(self) -> None:
        """Ends the observation; iteration stops."""
        self.cancel.cancel()

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _emit(self):
        if self._last is not None and self._last == self._cur:
            return None
        self._last = Observation(**{**self._cur.__dict__, "labels": dict(self._cur.labels)})
        return self._last

    def _apply(self, ev) -> bool:
        def leader():
            if ev.token <= self._top:
                return False
            self._cur = Observation(self.name, True, ev.session, ev.token, ev.owner, dict(ev.labels), ev.value)
            self._top = ev.token
            return True
        if ev.kind == EventKind.ACQUIRED:
            return leader()
        if ev.kind == EventKind.VALUE:
            if self._cur.leader and ev.token == self._cur.token:
                self._cur.value = ev.value
                return True
            return leader()
        if ev.kind in (EventKind.RELEASED, EventKind.EXPIRED, EventKind.REVOKED, EventKind.MAX_HOLD):
            if self._cur.leader and ev.token >= self._cur.token:
                self._cur = Observation(self.name)
                return True
        return False

    def _run(self):
        while not self.cancel.cancelled:
            info = self.c.inspect(self.name)
            self._cur = Observation(self.name)
            if info.held and info.token >= self._top:
                self._cur = Observation(self.name, True, info.session, info.token, info.owner, dict(info.labels),
                                        info.value)
                self._top = info.token
            o = self._emit()
            if o is not None:
                yield o
            for ev in self._watch:
                if ev.kind == EventKind.RESYNC:
                    break  # events may have been missed: read again
                if ev.key == self.name and self._apply(ev):
                    o = self._emit()
                    if o is not None:
                        yield o
            else:
                return  # the watch ended: cancelled
