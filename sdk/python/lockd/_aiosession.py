"""lockd.aio's sessions, locks and leaderships: the sync classes' trust
state and rules (session.py, lock.py, _acquire.py: deadlines from the send
time, held sets, notices, unclaimed grants) with awaitable calls on
grpc.aio. ``lost`` is an asyncio.Event; callbacks run on the event loop."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math

from . import errors
from . import lock as _lock
from . import session as _session
from ._acquire_all import _check_keys
from ._wait_updates import check_every
from .client import CLOSE_TIMEOUT
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")


def _no_sync(self, *exc):
    raise TypeError(f"{type(self).__name__} of lockd.aio: use 'async with'")


class Lock(_lock.Lock):
    """A granted lock (see :class:`lockd.Lock`): trusted until ``lost`` (an
    asyncio.Event) is set; ``valid()`` compares the monotonic clock with its
    deadline. ``async with`` releases it. Callbacks of ``on_lost`` run on
    the event loop."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lost = asyncio.Event()

    __enter__ = __exit__ = _no_sync

    async def __aenter__(self) -> "Lock":
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.release()
        except errors.NotOwner:
            pass

    async def set_value(self, value: bytes, timeout: float | None = -1.0) -> None:
        """Replaces the grant's value (token unchanged); LockLost once the lock is not trusted."""
        value = bytes(value)
        if len(value) > _lock.MAX_VALUE:
            raise errors.InvalidArgument(f"value: {len(value)} bytes, at most {_lock.MAX_VALUE}", field="value")
        if self.error is not None:
            raise errors.LockLost(f"set value of {self.key!r}: {self.error}")
        s = self.session
        await s.c._call("SetValue", pb.SetValueRequest(session_id=s.id, session_secret=s._secret, key=self.key,
                                                       token=self.token, value=value), timeout=timeout)

    async def release(self, timeout: float | None = -1.0) -> None:
        """Stops trusting the lock, then deletes the grant on the server,
        fenced by its token (see :meth:`lockd.Lock.release`)."""
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
                    self._ambiguous = True
            try:
                await s.c._call("Release", req, timeout=timeout, on_error=seen)
                self._released_ok = True
            except errors.NotOwner:
                if self._ambiguous and lost_before is None:
                    self._released_ok = True
                    return
                raise
        finally:
            done()


class Leadership:
    """A won election (see :class:`lockd.Leadership`); ``async with`` resigns."""

    def __init__(self, lock: Lock, value: bytes):
        self.lock = lock
        self.value = value

    def __repr__(self) -> str:
        return f"lockd.aio.Leadership({self.name!r}, token={self.token})"

    name = property(lambda self: self.lock.key)
    token = property(lambda self: self.lock.token)
    lost = property(lambda self: self.lock.lost)
    error = property(lambda self: self.lock.error)

    def on_lost(self, fn) -> None:
        """Calls fn(error) when the leadership's trust ends (at once if it
        has), as :meth:`Lock.on_lost`: fn runs on the event loop; ``lost`` is
        set before it runs."""
        self.lock.on_lost(fn)

    def valid(self) -> bool:
        """Whether the leadership is trusted now: its lock not lost and the
        monotonic clock before the lock's and the session's deadlines. Check
        it (or ``lost``) before acting as the leader."""
        return self.lock.valid()

    async def proclaim(self, value: bytes, timeout: float | None = -1.0) -> None:
        """Replaces the published value; the token stays, nobody else gets a
        turn. LockLost once the leadership is not trusted."""
        try:
            await self.lock.set_value(value, timeout=timeout)
        except errors.NotOwner as e:
            raise errors.LockLost(f"proclaim: {e}") from None
        self.value = bytes(value)

    async def resign(self, timeout: float | None = -1.0) -> None:
        """Gives up the leadership: the next candidate leads at once."""
        await self.lock.release(timeout=timeout)

    async def __aenter__(self) -> "Leadership":
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.resign()
        except errors.NotOwner:
            pass


class Session(_session.Session):
    """A session (see :class:`lockd.Session`) on the asyncio client: trusted
    until ``lost`` (an asyncio.Event) is set. ``async with`` closes it.
    Cancelling a task that awaits ``acquire``, ``acquire_all`` or
    ``campaign`` gives up the wait: the queue places are left (LeaveQueue)
    and a grant that raced the cancellation is released when the next
    heartbeat answer lists it (C2 #ct2-sdk rule 7)."""

    _lock_class = Lock

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lost = asyncio.Event()

    def __repr__(self) -> str:
        return f"lockd.aio.Session({self.id})"

    __enter__ = __exit__ = _no_sync

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @classmethod
    async def _aopen(cls, c, ttl: float, owner: str, labels: dict, lock_delay: float, timeout) -> "Session":
        req = cls._open_request(c, ttl, owner, labels, lock_delay)
        resp, sent = await c._call("OpenSession", req, timeout=timeout if timeout is not None else -1.0)
        return cls._opened(c, resp, sent, lock_delay)

    # --- background calls (tasks of the client) -------------------------

    def _abandon(self) -> None:
        req = pb.CloseSessionRequest(session_id=self.id, session_secret=self._secret)

        async def run():
            try:
                await self.c._call("CloseSession", req, timeout=CLOSE_TIMEOUT)
            except errors.LockdError:
                pass
        self.c._spawn(run(), "lockd-abandon")

    def _release_orphan(self, key: str, token: int) -> None:
        req = pb.ReleaseRequest(session_id=self.id, session_secret=self._secret, key=key, token=token)

        async def run():
            try:
                await self.c._call("Release", req, timeout=CLOSE_TIMEOUT, cancel=self._ended)
                log.debug("released a grant no lock knew: %s token %d", key, token)
            except errors.LockdError as e:
                log.debug("releasing a grant no lock knew failed: %s", e)
        self.c._spawn(run(), "lockd-orphan")

    def _leave_queue(self, key: str) -> None:
        req = pb.LeaveQueueRequest(session_id=self.id, session_secret=self._secret, key=key)

        async def run():
            try:
                await self.c._call("LeaveQueue", req, timeout=None, cancel=self._ended)
            except errors.LockdError as e:
                log.debug("leaving the queue of %r failed: %s", key, e)
        self.c._spawn(run(), "lockd-leave")

    # --- closing --------------------------------------------------------

    async def close(self, timeout: float | None = -1.0) -> None:
        """Ends the session (every lock is lost at once), waits for the
        keepalive task when it was the client's last session, and closes it
        on the server, releasing its locks. Retries until timeout."""
        self._end(errors.Closed("session closed"))
        await self.c.ka.settle()
        with self.mu:
            dead = isinstance(self._err, errors.SessionDead) and not isinstance(self._err, errors.SessionExpired)
            if dead or self._closed_ok:
                return
        await self.c._call("CloseSession", pb.CloseSessionRequest(session_id=self.id, session_secret=self._secret),
                           timeout=timeout)
        with self.mu:
            self._closed_ok = True

    async def _close_quietly(self, timeout: float) -> None:
        try:
            await self.close(timeout)
        except errors.LockdError:
            pass

    # --- acquiring ------------------------------------------------------

    async def acquire(self, key: str, timeout: float | None = None, *, value: bytes = b"", limit: int = 0,
                      shared: bool = False, exclusive: bool = False, lock_delay: float | None = None,
                      max_hold: float | None = None, no_deadlock_check: bool = False, on_wait_update=None,
                      wait_update_every: float | None = None) -> Lock:
        """Waits for the lock (see :meth:`lockd.Session.acquire`); cancel the
        task to give up. ``on_wait_update`` is called on the event loop (a
        plain function, not a coroutine function), never after acquire
        returned or raised."""
        if on_wait_update is not None and inspect.iscoroutinefunction(on_wait_update):
            raise errors.InvalidArgument("on_wait_update: a plain function, not a coroutine function",
                                         field="on_wait_update")
        req = self._request(key, value, limit, shared, exclusive, lock_delay, max_hold, True)
        every = check_every(wait_update_every) if on_wait_update is not None else 0.0
        req.no_deadlock_check = no_deadlock_check
        if timeout is not None:
            if timeout < 0:
                raise errors.InvalidArgument("timeout: negative", field="timeout")
            req.wait_timeout_ms = max(1, math.ceil(timeout * 1000))
        bound = None if timeout is None else timeout + self.c.call_timeout
        from ._aiowatch import WaitUpdates
        updates = WaitUpdates(self, key, every, on_wait_update) if on_wait_update is not None else None
        try:
            return await self._acquire(req, until_cancel=timeout is None, timeout=bound,
                                       answered=updates.stop if updates else None)
        except (errors.InvalidArgument, errors.PermissionDenied):
            raise
        except (errors.LockdError, asyncio.CancelledError):
            if self.error is None:
                self._leave_queue(key)
            raise
        finally:
            if updates is not None:
                updates.stop()
                await updates.wait()  # the task and its Inspect end before acquire returns (C2 #ct2-wait-updates)

    async def try_acquire(self, key: str, *, value: bytes = b"", limit: int = 0, shared: bool = False,
                          exclusive: bool = False, lock_delay: float | None = None, max_hold: float | None = None,
                          timeout: float | None = -1.0) -> Lock:
        """Takes the lock if it is free and nobody waits; else raises :class:`lockd.Locked` naming the holder."""
        req = self._request(key, value, limit, shared, exclusive, lock_delay, max_hold, False)
        try:
            return await self._acquire(req, until_cancel=False, timeout=timeout)
        except errors.Locked:
            try:
                info = await self.c.inspect(key, timeout=1.0)
            except errors.LockdError:
                raise errors.Locked(f"{key!r} is locked") from None
            if not info.held:
                raise
            raise errors.Locked(f"{key!r} is locked by {info.holder()}") from None

    async def _acquire(self, req, until_cancel: bool, timeout: float | None = None, answered=None) -> Lock:
        def record(resp, sent):
            if answered is not None:
                answered()
            if not resp.granted:
                raise errors.Locked(f"{req.key!r} is locked")
            d = self._extend(sent, resp.remaining_ms / 1000.0)
            hold_at = sent + req.max_hold_ms / 1000.0 if req.max_hold_ms > 0 else math.inf
            return self._add_lock(req.key, resp.token, d, hold_at)
        return await self._send_acquire(req, [req.key], until_cancel, timeout, record)

    async def _send_acquire(self, req, keys, until_cancel: bool, timeout: float | None, record):
        """Sends an Acquire of keys until it is answered, then returns
        record(resp, sent) while the keys are still busy (as the sync
        _send_acquire). The session's end ends the wait; a cancellation of
        the awaiting task cancels the RPC and the keys stop being busy, so a
        grant that raced it is released as unclaimed."""
        if self.error is not None:
            raise self.error
        dones = [self._busy(k) for k in keys]
        try:
            while True:
                try:
                    resp, sent = await self.c._call("Acquire", req, timeout=timeout, cancel=self._ended)
                    break
                except errors.WaitTimeout:
                    if until_cancel:
                        continue
                    raise
                except errors.Cancelled:
                    if self.error is not None:
                        raise self.error from None
                    raise
                except errors.LockdError as e:
                    self._check_server_err(e)
                    raise
            return record(resp, sent)
        finally:
            for done in dones:
                done()

    async def acquire_all(self, keys, timeout: float | None = None, no_deadlock_check: bool = False) -> list[Lock]:
        """Takes every lock of keys at once, or none (see
        :meth:`lockd.Session.acquire_all`); cancel the task to give up."""
        keys = _check_keys(keys)
        req = pb.AcquireRequest(session_id=self.id, session_secret=self._secret, keys=keys, wait=True,
                                no_deadlock_check=no_deadlock_check)
        if timeout is not None:
            if timeout < 0:
                raise errors.InvalidArgument("timeout: negative", field="timeout")
            req.wait_timeout_ms = max(1, math.ceil(timeout * 1000))
        bound = None if timeout is None else timeout + self.c.call_timeout
        # No kept places (C2 #ct2-acquire-all): the server leaves every queue
        # when the call ends without a grant, also when it is cancelled.
        return await self._acquire_all(req, until_cancel=timeout is None, timeout=bound)

    async def try_acquire_all(self, keys, timeout: float | None = -1.0) -> list[Lock]:
        keys = _check_keys(keys)
        req = pb.AcquireRequest(session_id=self.id, session_secret=self._secret, keys=keys)
        return await self._acquire_all(req, until_cancel=False, timeout=timeout)

    async def _acquire_all(self, req, until_cancel: bool, timeout: float | None) -> list[Lock]:
        got = []

        def record(resp, sent):
            got.append(self._record_all(req, resp, sent))
        try:
            await self._send_acquire(req, req.keys, until_cancel, timeout, record)
        except _GiveBack as gb:
            for f in gb.fresh:
                try:
                    await f.release(timeout=CLOSE_TIMEOUT)
                except errors.LockdError as e:
                    log.debug("releasing %r after a failed acquire_all failed: %s", f.key, e)
            for key, token in gb.rest:  # in the caller's task, as the sync _give_back
                try:
                    await self.c._call("Release", pb.ReleaseRequest(session_id=self.id, session_secret=self._secret,
                                                                    key=key, token=token), timeout=CLOSE_TIMEOUT)
                except errors.LockdError as e:
                    log.debug("releasing %r after a failed acquire_all failed: %s", key, e)
            raise gb.err from None
        return got[0]

    def _record_all(self, req, resp, sent) -> list[Lock]:
        """The sync _record_all without its blocking releases: a grant it
        cannot record raises _GiveBack with what to give back."""
        if not resp.granted:
            raise errors.Locked(f"one of {list(req.keys)!r} is locked")
        if len(resp.grants) != len(req.keys):
            raise errors.Unavailable(f"the server answered {len(resp.grants)} grants for {len(req.keys)} keys")
        d = self._extend(sent, resp.remaining_ms / 1000.0)
        locks, fresh = [], []
        for i, g in enumerate(resp.grants):
            with self.mu:
                had = self.locks.get(req.keys[i])
            try:
                if g.key != req.keys[i]:
                    raise errors.Unavailable(f"grant {i} names {g.key!r}, not {req.keys[i]!r}")
                l = self._add_lock(g.key, g.token, d)
            except errors.LockdError as e:
                rest = []
                for r in resp.grants[i:]:
                    with self.mu:
                        l = self.locks.get(r.key)
                    if l is None or l.token != r.token:
                        rest.append((r.key, r.token))
                raise _GiveBack(e, fresh, rest) from None
            if l is not had:
                fresh.append(l)
            locks.append(l)
        return locks

    async def campaign(self, name: str, value: bytes = b"", timeout: float | None = None) -> Leadership:
        """Waits in election name's FIFO queue until this session leads it (see :meth:`lockd.Session.campaign`)."""
        l = await self.acquire(name, timeout=timeout, value=value)
        return Leadership(l, bytes(value))


class _GiveBack(Exception):
    def __init__(self, err, fresh, rest):
        super().__init__(str(err))
        self.err, self.fresh, self.rest = err, fresh, rest
