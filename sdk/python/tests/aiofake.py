"""fake.FakeServer as grpc.aio stubs, for lockd.aio's timing tests: the
same fake server (answers as C2 says a server answers; no stand-in for
lockd's conformance), its unary methods awaitable and its KeepAlive stream
a grpc.aio-like call (write, read, done_writing, cancel). ``block`` holds an
Acquire until the test sets its Event; ``grant_on_cancel`` makes a blocked
Acquire that is cancelled grant the key all the same (a grant that raced the
cancellation: the server granted before it saw it)."""

from __future__ import annotations

import asyncio

import grpc

from .fake import FakeServer


class _Call:
    def __init__(self, fake, name, fn, req):
        self.fake, self.name, self.fn, self.req = fake, name, fn, req
        self.cancelled = False

    def __await__(self):
        return self._run().__await__()

    async def _run(self):
        self.fake.calls.append((self.name, self.req))
        ev = self.fake.block.get(self.name)
        if ev is not None:
            try:
                await ev.wait()
            except asyncio.CancelledError:
                if self.name in self.fake.grant_on_cancel:
                    self.fn(self.req)  # granted at the server; the reply is lost
                raise
        return self.fn(self.req)

    def cancel(self):
        self.cancelled = True
        return True


class _Method:
    def __init__(self, fake, name, fn):
        self.fake, self.name, self.fn = fake, name, fn

    def __call__(self, req, metadata=None, timeout=None):
        return _Call(self.fake, self.name, self.fn, req)


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"

    def trailing_metadata(self):
        return ()


class _Stream:
    """A KeepAlive stream of the fake server: write() serves the request
    at once (the fake's heartbeat handler, which may move the clock)."""

    def __init__(self, srv: FakeServer, loop, down: bool, owner=None):
        self.server, self.loop, self.down, self.owner = srv, loop, down, owner
        self.out: asyncio.Queue = asyncio.Queue()
        self.gen = next(srv._gens)
        self.ended = False

    async def write(self, r):
        if self.down or self.ended:
            raise _Unavailable()
        o = self.owner
        if o is not None and o.holding:
            o.held.append((self, r))  # at the server, unanswered until release()
            if o.holding > 0:
                o.holding -= 1
            return
        self.serve(r)

    def serve(self, r):
        try:
            self.server._heartbeat(self, r)
        except Exception:
            self.push(None)  # the fake's handler failed: the stream ends (as the sync fake's)
            self.ended = True

    def push(self, r):
        if r is not None and self.owner is not None and self.owner.draining:
            r.draining = True  # this address's replica drains
        # srv.revoke may push from the test's thread
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, r)
        except RuntimeError:
            pass

    async def done_writing(self):
        pass

    def cancel(self):
        self.ended = True
        self.push(None)
        return True

    async def read(self):
        if self.down:
            raise _Unavailable()
        r = await self.out.get()
        if r is None:
            return grpc.aio.EOF
        return r


class AioFake:
    def __init__(self, srv: FakeServer):
        self.srv = srv
        self.calls: list = []
        self.block: dict[str, asyncio.Event] = {}
        self.grant_on_cancel: set[str] = set()
        self.down = None       # None: the server's; True: this address's streams break at once
        self.draining = False  # this address's KeepAlive answers say draining
        self.streams: list = []
        self.holding = 0       # heartbeats held unanswered: n the next n, -1 all (until release)
        self.held: list = []
        for name in ("OpenSession", "Acquire", "Release", "CloseSession", "LeaveQueue"):
            setattr(self, name, _Method(self, name, getattr(srv, name)._fn))

    def stub(self, addr):
        return self

    def KeepAlive(self, metadata=None):
        srv = self.srv
        with srv.mu:
            srv.dials.append(srv.clock.now())
            down = srv.down if self.down is None else self.down
        s = _Stream(srv, asyncio.get_running_loop(), down, self)
        self.streams.append(s)
        if not down:
            with srv.mu:
                srv.streams.append(s)
        return s

    def release(self, stop_holding=True):
        """Answers the held heartbeats (on their streams, as the fake's handler does)."""
        if stop_holding:
            self.holding = 0
        held, self.held = self.held, []
        for st, r in held:
            if not st.ended:
                st.serve(r)

    def names(self):
        return [n for n, _ in self.calls]
