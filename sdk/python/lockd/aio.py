"""The asyncio API: the sync SDK's objects with awaitable calls.

One implementation keeps the timing rules (docs/contracts/C2.md #ct2-sdk):
this module runs the sync SDK's blocking calls on threads of their own and
hands results to the event loop, so sessions here are kept alive by the same
client-owned keepalive thread, whatever the event loop is doing (a loop
blocked by the application cannot starve the heartbeats). A lock's loss sets
its ``lost`` asyncio.Event from that thread (call_soon_threadsafe).
Cancelling a task that awaits ``acquire`` cancels the wait on the server
(its queue place is left); a grant that raced the cancellation is released.

    async with lockd.aio.Client("127.0.0.1:7420") as c:
        async with await c.session(ttl=15) as s:
            async with await s.acquire("jobs/nightly", timeout=30) as lock:
                await work(lock.token)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading

from . import errors
from ._cancel import Cancel
from .client import Client as _SyncClient

log = logging.getLogger("lockd")


async def _run(fn, *args, **kw):
    """Runs the blocking fn on a thread of its own; the result or exception comes back to the loop."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def done(ok, v):
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(v)

    def run():
        try:
            r = fn(*args, **kw)
        except BaseException as e:  # handed to the awaiting task
            loop.call_soon_threadsafe(done, False, e)
        else:
            loop.call_soon_threadsafe(done, True, r)
    threading.Thread(target=run, name="lockd-aio", daemon=True).start()
    return await fut


def _on_loop(fn):
    """The sync acquire's on_wait_update for fn, which runs on the running
    event loop. The sync acquire joins its reading thread before it returns,
    so every call it scheduled runs before the awaiting task sees the result
    (the loop runs callbacks in order). A fn that raises ends the updates, as
    in the sync SDK."""
    if inspect.iscoroutinefunction(fn):
        raise errors.InvalidArgument("on_wait_update: a plain function, not a coroutine function",
                                     field="on_wait_update")
    loop = asyncio.get_running_loop()
    failed = threading.Event()

    def on_loop(u):
        if failed.is_set():
            return
        try:
            fn(u)
        except Exception as e:  # the caller's; it ends the updates, never the acquire
            failed.set()
            log.debug("on_wait_update raised, no more wait updates for %r: %r", u.key, e)

    def from_thread(u):
        if not failed.is_set():
            loop.call_soon_threadsafe(on_loop, u)
    return from_thread


def _release_each(got) -> None:
    """Releases (or resigns) every lock of got, each on its own: one that
    fails (the session ended meanwhile: nothing is held) stops no other."""
    for obj in got:
        try:
            (obj.release if hasattr(obj, "release") else obj.resign)()
        except errors.LockdError:
            pass


async def _give_back(task, as_list) -> None:
    """After the caller's task was cancelled and the blocking call told to
    stop: waits for that call to end, however often the task is cancelled
    again, and releases what it returned — grants that raced the
    cancellation — so that nothing stays held until the session ends. The
    caller raises its CancelledError afterwards. Before, a second
    cancellation while waiting here cancelled the wait and left such grants
    held."""
    while True:
        try:
            got = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            continue  # the caller's task cancelled again: the call still ends (its cancel fired)
        except errors.LockdError:
            return  # the call ended without a grant
    rel = asyncio.ensure_future(_run(_release_each, as_list(got)))
    while True:
        try:
            await asyncio.shield(rel)
            return
        except asyncio.CancelledError:
            continue


class _Lost:
    """An asyncio.Event set when the sync object's trust ends."""

    def _watch_loss(self, obj) -> None:
        loop = asyncio.get_running_loop()
        self.lost = asyncio.Event()

        def on_lost(_err):
            try:
                loop.call_soon_threadsafe(self.lost.set)
            except RuntimeError:
                pass  # the loop is closed
        obj.on_lost(on_lost)


class Lock(_Lost):
    """A granted lock (see :class:`lockd.Lock`); ``lost`` is an asyncio.Event."""

    def __init__(self, lock):
        self.sync = lock
        self._watch_loss(lock)

    key = property(lambda self: self.sync.key)
    token = property(lambda self: self.sync.token)
    deadline = property(lambda self: self.sync.deadline)
    error = property(lambda self: self.sync.error)

    def valid(self) -> bool:
        return self.sync.valid()

    def on_lost(self, fn) -> None:
        self.sync.on_lost(fn)

    async def set_value(self, value: bytes, timeout=-1.0) -> None:
        await _run(self.sync.set_value, value, timeout)

    async def release(self, timeout=-1.0) -> None:
        await _run(self.sync.release, timeout)

    async def __aenter__(self) -> "Lock":
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.release()
        except errors.NotOwner:
            pass


class Leadership(_Lost):
    """A won election (see :class:`lockd.Leadership`)."""

    def __init__(self, lead):
        self.sync = lead
        self._watch_loss(lead)

    name = property(lambda self: self.sync.name)
    token = property(lambda self: self.sync.token)
    value = property(lambda self: self.sync.value)
    error = property(lambda self: self.sync.error)

    def valid(self) -> bool:
        return self.sync.valid()

    async def proclaim(self, value: bytes, timeout=-1.0) -> None:
        await _run(self.sync.proclaim, value, timeout)

    async def resign(self, timeout=-1.0) -> None:
        await _run(self.sync.resign, timeout)

    async def __aenter__(self) -> "Leadership":
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.resign()
        except errors.NotOwner:
            pass


class Session(_Lost):
    """A session (see :class:`lockd.Session`)."""

    def __init__(self, s):
        self.sync = s
        self._watch_loss(s)

    id = property(lambda self: self.sync.id)
    deadline = property(lambda self: self.sync.deadline)
    error = property(lambda self: self.sync.error)

    def valid(self) -> bool:
        return self.sync.valid()

    async def _wait(self, call, **kw):
        """Runs a waiting call; task cancellation cancels it, and a result that
        raced the cancellation is released."""
        cancel = Cancel()
        task = asyncio.ensure_future(_run(functools.partial(call, cancel=cancel, **kw)))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.cancel()
            await _give_back(task, lambda got: [got])
            raise

    async def acquire(self, key: str, timeout: float | None = None, **kw) -> Lock:
        """Waits for the lock (see :meth:`lockd.Session.acquire`); cancel the task to give up.
        ``on_wait_update`` is called on the event loop (a plain function, not
        a coroutine function), never after acquire returned or raised."""
        if kw.get("on_wait_update") is not None:
            kw["on_wait_update"] = _on_loop(kw["on_wait_update"])
        return Lock(await self._wait(self.sync.acquire, key=key, timeout=timeout, **kw))

    async def try_acquire(self, key: str, **kw) -> Lock:
        return Lock(await _run(self.sync.try_acquire, key, **kw))

    async def acquire_all(self, keys, timeout: float | None = None, no_deadlock_check: bool = False) -> list[Lock]:
        """Takes every lock of keys at once, or none (see
        :meth:`lockd.Session.acquire_all`); cancel the task to give up (grants
        that raced the cancellation are released)."""
        cancel = Cancel()
        task = asyncio.ensure_future(_run(functools.partial(self.sync.acquire_all, keys, timeout=timeout,
                                                            cancel=cancel, no_deadlock_check=no_deadlock_check)))
        try:
            got = await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.cancel()
            await _give_back(task, list)
            raise
        return [Lock(l) for l in got]

    async def try_acquire_all(self, keys) -> list[Lock]:
        return [Lock(l) for l in await _run(self.sync.try_acquire_all, keys)]

    async def campaign(self, name: str, value: bytes = b"", timeout: float | None = None) -> Leadership:
        return Leadership(await self._wait(self.sync.campaign, name=name, value=value, timeout=timeout))

    async def close(self, timeout=-1.0) -> None:
        await _run(self.sync.close, timeout)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _Iter:
    """An async iterator over a sync iterator that has close()."""

    def __init__(self, it):
        self.it = it

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await _run(next, self.it)
        except StopIteration:
            raise StopAsyncIteration from None
        except asyncio.CancelledError:
            self.it.close()
            raise

    async def aclose(self) -> None:
        self.it.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        self.it.close()


class Client:
    """The asyncio client: :class:`lockd.Client`'s arguments; the sync client is ``sync``."""

    def __init__(self, target: str = "", **kw):
        self.sync = _SyncClient(target, **kw)

    async def session(self, **kw) -> Session:
        return Session(await _run(self.sync.session, **kw))

    async def inspect(self, key: str, timeout=-1.0):
        return await _run(self.sync.inspect, key, timeout)

    async def check_token(self, key: str, token: int, cached: bool = False, timeout=-1.0):
        return await _run(self.sync.check_token, key, token, cached, timeout)

    async def list(self, prefix: str = "", page_token: str = "", limit: int = 0):
        return await _run(self.sync.list, prefix, page_token, limit)

    async def hot_keys(self, prefix: str = "", limit: int = 0, timeout=-1.0):
        return await _run(self.sync.hot_keys, prefix, limit, timeout)

    async def revoke(self, key: str, timeout=-1.0):
        return await _run(self.sync.revoke, key, timeout)

    async def close_sessions(self, principal: str, timeout=-1.0):
        return await _run(self.sync.close_sessions, principal, timeout)

    async def watch(self, prefix: str = "", holders: bool = False) -> _Iter:
        """An async iterator of events, returned once the watch is established."""
        return _Iter(await _run(self.sync.watch, prefix, holders))

    async def observe(self, name: str) -> _Iter:
        return _Iter(await _run(self.sync.observe, name))

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
