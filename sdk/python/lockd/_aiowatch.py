"""lockd.aio's watch (resumed after a break, C2 #ct2-watch-resume,
#ct2-watch-progress), election observer and acquire's waiting updates
(#ct2-wait-updates), on grpc.aio."""

from __future__ import annotations

import asyncio
import logging

import grpc

from . import errors
from ._aioclient import cancelling
from ._types import Event, EventKind, LockInfo, Observation, lock_info
from ._wait_updates import FIRST_READ, WaitUpdate, _key
from .client import validate_key
from .election import Observer as _SyncObserver
from .v1 import lockd_pb2 as pb
from .watch import CURSOR_HEADER, MIN_SILENCE

log = logging.getLogger("lockd")


class Watch:
    """An async iterator of :class:`lockd.Event` in commit order, resumed
    after a break as :class:`lockd.Watch` is. ``aclose()`` (or ``async
    with`` exit, or cancelling the task iterating it) ends it."""

    def __init__(self, c, prefix: str, holders: bool):
        self.c, self.prefix, self.holders = c, prefix, holders
        self.cursor = ""
        self._closed = False
        self._call = None
        self._addr = ""
        self._first = None
        self._bound = 0.0
        self._silent = False
        self._resync = False

    @classmethod
    async def _open(cls, c, prefix: str, holders: bool, timeout) -> "Watch":
        if len(prefix.encode()) > 512 or "\x00" in prefix:
            raise errors.InvalidArgument("prefix: at most 512 bytes, no NUL byte", field="prefix")
        w = cls(c, prefix, holders)
        await w._connect(timeout)
        return w

    def __repr__(self) -> str:
        return f"lockd.aio.Watch({self.prefix!r})"

    def __aiter__(self):
        return self

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Ends the watch; iteration stops."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    def _on_silent(self, call) -> None:
        if self.c.conn.set_aside(self._addr or "", draining=False):
            self._silent = True
            call.cancel()

    async def _connect(self, timeout) -> None:
        """Opens a stream from the cursor, retrying until established, timeout, aclose or a refusal."""
        c = self.c
        resume = self.cursor
        until = None if timeout is None else c.clock.now() + (c.call_timeout if timeout == -1.0 else timeout)
        attempt = 0
        while True:
            if self._closed:
                raise StopAsyncIteration
            addr, stub = c.conn.pick()
            call = stub.Watch(pb.WatchRequest(prefix=self.prefix, holder=self.holders, resume_after=resume,
                                              progress=True), metadata=c.conn.metadata)
            self._call, self._addr = call, addr
            timer = c.timers.at(c.clock.now() + self._bound, lambda: self._on_silent(call)) \
                if self._bound and c.conn.several else None
            err = None
            try:
                md = await call.initial_metadata()
                first = None
                if not md:
                    first = await call.read()  # no headers: the status (or an event of an old server) says why
                    if first is grpc.aio.EOF:
                        first, err = None, errors.Unavailable("watch ended before it was established")
                self._first = first
            except grpc.RpcError as e:
                err = errors.from_rpc(e)
            except asyncio.CancelledError:
                if cancelling():
                    call.cancel()
                    raise
                err = errors.Unavailable("watch stream cancelled")
            finally:
                if timer is not None:
                    timer.cancel()
            if err is None:
                log.debug("watch %r established on %s", self.prefix, addr)
                start = ""
                for k, v in md or ():
                    if k == CURSOR_HEADER:
                        start = v
                if not resume:
                    self.cursor = start
                elif not start:
                    self.cursor, self._resync = "", True
                return
            if self._closed:
                raise StopAsyncIteration
            if self._silent:
                err, self._silent = errors.Unavailable("watch stream silent (its replica stalled)"), False
            if not err.retryable:
                raise err
            c.conn.after_error(addr, err)
            if until is not None and c.clock.now() >= until:
                raise err
            if not await c._sleep(c._backoff(attempt)):
                raise StopAsyncIteration
            attempt += 1

    async def __anext__(self) -> Event:
        c = self.c
        while True:
            if self._resync:
                self._resync = False
                return Event(kind=EventKind.RESYNC)
            if self._closed:
                raise StopAsyncIteration
            timer = None
            call = self._call
            if self._bound and c.conn.several:
                timer = c.timers.at(c.clock.now() + self._bound, lambda: self._on_silent(call))
            err = None
            try:
                if self._first is not None:
                    r, self._first = self._first, None
                else:
                    r = await call.read()
                if r is grpc.aio.EOF:
                    err = errors.Unavailable("watch ended")
            except grpc.RpcError as e:
                err = errors.from_rpc(e)
            except asyncio.CancelledError:
                if cancelling():
                    await self.aclose()
                    raise
                err = errors.Unavailable("watch stream cancelled")
            finally:
                if timer is not None:
                    timer.cancel()
            if err is not None:
                if self._closed:
                    raise StopAsyncIteration
                if self._silent:
                    err, self._silent = errors.Unavailable("watch stream silent (its replica stalled)"), False
                if err.retryable and self.cursor:
                    log.debug("watch resuming: %s", err)
                    if isinstance(err, errors.ShuttingDown):
                        c.conn.set_aside(self._addr, draining=True)
                    await self._connect(None)
                    continue
                raise err
            if r.kind == pb.EVENT_KIND_PROGRESS:
                if r.cursor:
                    self.cursor = r.cursor
                if r.progress_interval_ms > 0:
                    self._bound = max(3 * r.progress_interval_ms / 1000.0, MIN_SILENCE)
                continue
            if r.cursor:
                self.cursor = r.cursor
            return Event(kind=EventKind(r.kind), key=r.key, session=r.session_id, token=r.token, owner=r.owner,
                         labels=dict(r.labels), value=bytes(r.value), cursor=r.cursor)


class Observer:
    """The leader of an election as it changes (see :class:`lockd.Observer`):
    an async iterator of :class:`lockd.Observation`; ``aclose()`` ends it."""

    def __init__(self, c, name: str):
        validate_key(name, "name")
        self.c, self.name = c, name
        self._watch = None
        self._cur = Observation(name)
        self._last = None
        self._top = 0
        self._gen = None

    @classmethod
    async def _open(cls, c, name: str) -> "Observer":
        o = cls(c, name)
        o._watch = await c.watch(name, holders=True)
        o._gen = o._run()
        return o

    def __aiter__(self):
        return self

    async def __anext__(self) -> Observation:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Ends the observation; iteration stops."""
        await self._watch.aclose()
        await self._gen.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # What an event or a read changes, and whether to say it: the sync Observer's.
    _emit = _SyncObserver._emit
    _apply = _SyncObserver._apply

    async def _run(self):
        while not self._watch._closed:
            info = await self.c.inspect(self.name)
            self._cur = Observation(self.name)
            if info.held and info.token >= self._top:
                self._cur = Observation(self.name, True, info.session, info.token, info.owner, dict(info.labels),
                                        info.value)
                self._top = info.token
            o = self._emit()
            if o is not None:
                yield o
            resync = False
            async for ev in self._watch:
                if ev.kind == EventKind.RESYNC:
                    resync = True
                    break  # events may have been missed: read again
                if ev.key == self.name and self._apply(ev):
                    o = self._emit()
                    if o is not None:
                        yield o
            if not resync:
                return  # the watch ended: closed


class WaitUpdates:
    """The Inspect reads of one acquire (C2 #ct2-wait-updates): a task of
    the client; fn runs on the event loop, never after stop()."""

    def __init__(self, session, key: str, every: float, fn):
        self._s, self._key, self._every, self._fn = session, key, every, fn
        self._stopped = False
        self._last = None
        self._task = session.c._spawn(self._run(), "lockd-wait-updates", inherit=True)  # the acquire's reads

    def stop(self) -> None:
        """Ends the reads: fn is not called after stop returns (an Inspect in flight is cancelled)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    async def wait(self) -> None:
        """Waits for the task stop() ended."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        c = self._s.c
        d = min(FIRST_READ, self._every)
        while await c._sleep(d) and not self._stopped:
            sent = c.clock.now()
            if not await self._read():
                return
            d = max(0.0, self._every - (c.clock.now() - sent))

    async def _read(self) -> bool:
        c, me = self._s.c, self._s.id
        try:
            resp, _ = await c._call("Inspect", pb.InspectRequest(key=self._key), timeout=max(self._every, 1.0))
            err = None
        except (errors.Cancelled, errors.Closed):
            return False
        except errors.LockdError as e:
            resp, err = None, e
        if self._stopped:
            return False
        if err is not None:
            u = WaitUpdate(key=self._key, error=err)
        else:
            info = lock_info(resp.lock) if resp.held else LockInfo(key=self._key)
            if info.held and (info.session == me or any(h.session == me for h in info.holders)):
                return True  # granted: the reply is on its way
            pos = info.waiters.index(me) + 1 if me in info.waiters else 0
            est = next((e.wait for e in info.wait_estimates if e.session == me), None)
            u = WaitUpdate(key=self._key, position=pos, waiters=len(info.waiters), estimate=est, info=info)
        if self._last is None or _key(self._last) != _key(u):
            self._last = u
            try:
                self._fn(u)
            except Exception as e:  # the caller's; it ends the updates, never the acquire
                log.debug("on_wait_update raised, no more wait updates for %r: %r", self._key, e)
                return False
        return not isinstance(err, errors.PermissionDenied)
