"""lockd.aio's Client: grpc.aio channels, retried calls, timers on the event
loop, and the tasks the client owns (docs/contracts/C2.md #ct2-sdk).

Everything here runs on one event loop: the loop the client is first used
on. The timing rules are the sync SDK's own functions (session.py,
_keepalive.py), called from the loop; only the waiting is asyncio's.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random

import grpc

from . import _conn, _hotkeys, _trace, errors
from ._cancel import Cancel
from ._clock import Clock, FakeClock
from ._hotkeys import HotKeys
from ._types import LockInfo, TokenCheck, lock_info
from .client import CLOSE_TIMEOUT, check_timing, validate_key
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")


def cancelling() -> bool:
    """Whether the running task is being cancelled (asyncio.Task.cancelling)."""
    t = asyncio.current_task()
    return t is not None and t.cancelling() > 0


class _FakeTimer:
    """A timer on a FakeClock: runs fn on the loop once advance() reached when."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: FakeClock, when: float, fn):
        self.loop, self.clock, self.when, self.fn = loop, clock, when, fn
        self.done = False
        self.tid = clock.add_timer(when, self._wake)
        loop.call_soon(self._check)

    def _wake(self) -> None:  # any thread (FakeClock.advance)
        try:
            self.loop.call_soon_threadsafe(self._check)
        except RuntimeError:
            pass  # the loop is closed

    def _check(self) -> None:
        if self.done or self.clock.now() < self.when:
            return
        self.cancel()
        self.fn()

    def cancel(self) -> None:
        self.done = True
        self.clock.remove_timer(self.tid)


class Sched:
    """Runs functions on the event loop at instants of the client's clock
    (the deadline timers, the heartbeat schedule, backoff). at() returns a
    handle with cancel(), like the sync SDK's Timers."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self._fake = isinstance(clock, FakeClock)

    def at(self, when: float, fn):
        loop = asyncio.get_running_loop()
        if self._fake:
            return _FakeTimer(loop, self.clock, when, fn)
        return loop.call_later(max(0.0, when - self.clock.now()), fn)

    def stop(self) -> None:
        pass


class Conn(_conn.Conn):
    """The sync SDK's address choice (failover, set-asides) over grpc.aio channels."""

    def _dial(self, addr: str, opts):
        if self._creds is not None:
            return grpc.aio.secure_channel(addr, self._creds, options=opts)
        return grpc.aio.insecure_channel(addr, options=opts)

    async def aclose(self) -> None:
        for ch in self._take_channels():
            await ch.close()


class Core:
    """The parts of the asyncio client the sessions use: clock, timers,
    calls with retries, owned tasks (Client is the public face)."""

    def __init__(self, target: str = "", *, addresses=None, tls: _conn.TLS | None = None, insecure: bool = False,
                 token: str | None = None, token_file: str | None = None, ttl: float = 0,
                 safety_margin: float = 0, heartbeat_interval: float = 0,
                 backoff: tuple[float, float] = (0.05, 2.0), call_timeout: float = 30.0,
                 clock: Clock | None = None, tracer_provider=None, _stub_factory=None):
        from ._aiokeepalive import Keepaliver
        addrs = list(addresses) if addresses else [a.strip() for a in target.split(",") if a.strip()]
        if token is not None and token_file is not None:
            raise errors.InvalidArgument("give token or token_file, not both", field="token")
        if token_file is not None:
            token = _conn.read_token_file(token_file)
        if not 0 < backoff[0] <= backoff[1]:
            raise errors.InvalidArgument("backoff bounds must satisfy 0 < min <= max", field="backoff")
        check_timing(ttl, safety_margin, heartbeat_interval)
        self._tracing = _trace.tracing(tracer_provider)
        self.clock = clock or Clock()
        self.conn = Conn(addrs, tls, insecure, token, now=self.clock.now, stub_factory=_stub_factory, backoff=backoff)
        self.ttl, self.safety_margin, self.heartbeat_interval = ttl, safety_margin, heartbeat_interval
        self.backoff_min, self.backoff_max = backoff
        self.call_timeout = call_timeout
        self._closing = Cancel()
        self._tasks: set[asyncio.Task] = set()
        self.timers = Sched(self.clock)
        self.ka = Keepaliver(self)

    def _backoff(self, attempt: int) -> float:
        d = min(self.backoff_min * (2 ** min(attempt, 16)), self.backoff_max)
        return d / 2 + random.uniform(0, d / 2)

    async def _sleep(self, d: float, cancel: Cancel | None = None) -> bool:
        """Waits d on the client's clock; False when cancel or close came first."""
        fut = asyncio.get_running_loop().create_future()

        def wake():
            if not fut.done():
                fut.set_result(None)
        undo = [x.on_cancel(wake) for x in (self._closing, cancel) if x is not None]
        h = self.timers.at(self.clock.now() + d, wake)
        try:
            await fut
        finally:
            h.cancel()
            for u in undo:
                u()
        return not (self._closing.cancelled or (cancel is not None and cancel.cancelled))

    async def _call(self, method: str, req, *, timeout: float | None = -1.0, cancel: Cancel | None = None,
                    on_error=None):
        """The sync Client._call on grpc.aio: calls method until it succeeds,
        fails for good, timeout (-1: call_timeout; None: no bound) runs out
        or cancel fires; returns (reply, send time). Cancelling the awaiting
        task cancels the RPC and raises CancelledError."""
        if timeout == -1.0:
            timeout = self.call_timeout
        until = None if timeout is None else self.clock.now() + timeout
        last: errors.LockdError | None = None
        attempt = 0
        while True:
            if self._closing.cancelled:
                raise errors.Closed("client closed")
            if cancel is not None and cancel.cancelled:
                raise errors.Cancelled("cancelled") from last
            addr, stub = self.conn.pick()
            rem = None if until is None else until - self.clock.now()
            if rem is not None and rem <= 0:
                raise (last or errors.DeadlineExceeded(f"{method}: timed out"))
            md, span, code = self.conn.metadata, None, grpc.StatusCode.UNKNOWN
            if self._tracing is not None:
                span, md = self._tracing.start(method, md)  # in the calling task's context: its span is the parent
            sent = self.clock.now()
            call = getattr(stub, method)(req, metadata=md, timeout=rem)
            fired = []

            def stop(call=call, fired=fired):
                fired.append(True)
                call.cancel()
            undo = [x.on_cancel(stop) for x in (cancel, self._closing) if x is not None]
            try:
                resp = await call
                code = grpc.StatusCode.OK
                return resp, sent
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                if not fired or cancelling():
                    raise  # the task's own cancellation
                err = errors.Cancelled("cancelled")
            except grpc.RpcError as e:
                code = e.code() if isinstance(e.code(), grpc.StatusCode) else grpc.StatusCode.UNKNOWN
                err = errors.from_rpc(e)
            finally:
                for u in undo:
                    u()
                if span is not None:
                    self._tracing.end(span, code)
            if fired:
                if self._closing.cancelled:
                    raise errors.Closed("client closed") from last
                raise errors.Cancelled("cancelled") from last
            if on_error is not None:
                on_error(err)
            if not err.retryable:
                if isinstance(err, errors.DeadlineExceeded) and last is not None:
                    raise last
                raise err
            self.conn.after_error(addr, err)
            last = err
            log.debug("retrying %s: %s", method, err)
            d = self._backoff(attempt)
            attempt += 1
            if until is not None:
                d = min(d, max(0.0, until - self.clock.now()))
            if not await self._sleep(d, cancel):
                if self._closing.cancelled:
                    raise errors.Closed("client closed") from last
                raise errors.Cancelled("cancelled") from last

    def _spawn(self, coro, name: str, inherit: bool = False) -> asyncio.Task | None:
        """Runs coro as a task the client owns: close() waits for it. Unless
        inherit (work for the caller's call while it runs), in an empty
        context: what the client does on its own for a session is no child
        of the caller's current span (C4 #ct4-traces), as the sync SDK's
        threads."""
        if self._closing.cancelled:
            coro.close()
            return None
        ctx = contextvars.copy_context() if inherit else contextvars.Context()
        t = asyncio.get_running_loop().create_task(coro, name=name, context=ctx)
        self._tasks.add(t)

        def done(t):
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.debug("%s failed: %r", name, t.exception())
        t.add_done_callback(done)
        return t


class Client(Core):
    """The asyncio client: :class:`lockd.Client`'s arguments, on grpc.aio.
    Use it on one event loop. All sessions of a client share one KeepAlive
    stream, kept by a task that runs while the client has a session;
    ``close()`` (also ``async with`` exit) closes the sessions and waits for
    every task the client started."""

    def __repr__(self) -> str:
        return f"lockd.aio.Client({','.join(self.conn.addresses)})"

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def session(self, ttl: float = 0, owner: str = "", labels: dict | None = None, lock_delay: float = 0,
                      timeout: float | None = None):
        """Opens a session (see :meth:`lockd.Client.session`); ``async with`` closes it."""
        from ._aiosession import Session
        return await Session._aopen(self, ttl or self.ttl, owner, labels or {}, lock_delay, timeout)

    async def inspect(self, key: str, timeout: float | None = -1.0) -> LockInfo:
        """Describes key: its holder(s), token, waiters, owner, labels, value and
        lock-delay (see :meth:`lockd.Client.inspect`); a free key's LockInfo has
        held False. Needs read access to the key."""
        validate_key(key)
        resp, _ = await self._call("Inspect", pb.InspectRequest(key=key), timeout=timeout)
        if not resp.held:
            return LockInfo(key=key, delay_remaining=resp.lock.delay_remaining_ms / 1000.0)
        return lock_info(resp.lock)

    async def check_token(self, key: str, token: int, cached: bool = False, timeout: float | None = -1.0) -> TokenCheck:
        """Whether (key, token) is a current grant of key: Chubby's
        CheckSequencer, for a resource handed a fencing token (C2
        #ct2-check-token; see :meth:`lockd.Client.check_token`). A key nobody
        holds is not current. By default the server reads the backend;
        cached=True answers from its watch-fed index, at most one watch
        delivery delay behind. Needs read access to the key, like inspect."""
        validate_key(key)
        if not isinstance(token, int) or isinstance(token, bool) or token <= 0 or token >= 1 << 64:
            raise errors.InvalidArgument("token: want a fencing token (1 to 2**64-1)", field="token")
        consistency = pb.CHECK_CONSISTENCY_CACHED if cached else pb.CHECK_CONSISTENCY_LINEARIZABLE
        resp, _ = await self._call("CheckToken", pb.CheckTokenRequest(key=key, token=token, consistency=consistency),
                                   timeout=timeout)
        return TokenCheck(current=resp.current, tokens=list(resp.tokens), cached=resp.cached)

    async def list(self, prefix: str = "", page_token: str = "", limit: int = 0, timeout: float | None = -1.0):
        """One page of the held keys starting with prefix: (infos, next page token or "")."""
        resp, _ = await self._call("List", pb.ListRequest(prefix=prefix, page_token=page_token, limit=limit),
                                   timeout=timeout)
        return [lock_info(p) for p in resp.locks], resp.next_page_token

    async def hot_keys(self, prefix: str = "", limit: int = 0, timeout: float | None = -1.0) -> HotKeys:
        """Which keys under prefix the lockd process this client is connected
        to saw waited for and held most over its recent window (see
        :meth:`lockd.Client.hot_keys`, C2 #ct2-hotkeys)."""
        resp, _ = await self._call("HotKeys", _hotkeys.request(prefix, limit), timeout=timeout)
        return _hotkeys.answer(resp)

    async def revoke(self, key: str, timeout: float | None = -1.0) -> LockInfo:
        """Deletes key's grant whoever holds it (an admin remedy: needs admin on
        the key); returns the revoked grant (held False: the key was free).
        The holder's SDK learns it by a notice or its next heartbeat's held
        set and stops trusting the lock."""
        validate_key(key)
        resp, _ = await self._call("Revoke", pb.RevokeRequest(key=key), timeout=timeout)
        if not resp.revoked:
            return LockInfo(key=key)
        return LockInfo(key=key, held=True, session=resp.session_id, token=resp.token)

    async def close_sessions(self, principal: str, timeout: float | None = -1.0) -> tuple[int, int]:
        """Closes every live session bound to principal, as each session's own
        close would (C2 #ct2-close-sessions; see
        :meth:`lockd.Client.close_sessions`). Returns (sessions closed, locks
        released)."""
        resp, _ = await self._call("CloseSessions", pb.CloseSessionsRequest(principal=principal), timeout=timeout)
        return resp.closed, resp.released

    async def watch(self, prefix: str = "", holders: bool = False, timeout: float | None = -1.0):
        """An async iterator of :class:`lockd.Event` (see :class:`lockd.Watch`),
        returned once the watch is established; ``aclose()`` ends it."""
        from ._aiowatch import Watch
        return await Watch._open(self, prefix, holders, timeout)

    async def observe(self, name: str):
        """The leader of election name as it changes: an async iterator of :class:`lockd.Observation`."""
        from ._aiowatch import Observer
        return await Observer._open(self, name)

    async def close(self) -> None:
        """Closes every session (best effort within CLOSE_TIMEOUT), stops the
        keepalive task, waits for every task the client started and closes
        the channels. Idempotent."""
        if self._closing.cancelled:
            return
        await asyncio.gather(*(s._close_quietly(CLOSE_TIMEOUT) for s in self.ka.all()))
        self._closing.cancel()
        await self.ka.stop()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.conn.aclose()
