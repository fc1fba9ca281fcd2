"""lockd.aio's KeepAlive stream: the sync Keepaliver's schedule and reply
handling (the same methods: beat_soon, beat_before_deadline, handle) driven
by tasks of the event loop instead of threads (docs/contracts/C2.md #ct2-sdk
rules 4-8, 11).

One task (lockd-keepalive) runs while the client has a session: it opens the
stream, sends every session's heartbeats and re-dials; a reader task per
stream applies replies as they arrive. A stream left on purpose (draining,
stalled) keeps its reader until its heartbeats in flight are answered or
forgotten (a lingerer task); a stalled one is also still written heartbeats
until a later stream answers (a shadow, C2 #ct2-failover). The last
session's end cancels the keepalive task; Session.close and Client.close
wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc

from . import _keepalive, errors
from ._aioclient import cancelling
from ._keepalive import _Flight, beat_slack, forget_unanswered, jitter
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

SHADOW_QUEUE = 256  # heartbeats waiting for a shadow's writer; more are not sent


class Keepaliver(_keepalive.Keepaliver):
    def __init__(self, c):  # no thread: tasks, started with the first session
        self.c = c
        self.cv = threading.Condition()  # the sync methods' lock; uncontended on one loop
        self.sessions: dict[str, list] = {}
        self.stopped = False
        self.poked = False
        self.gen = 0
        self._task: asyncio.Task | None = None
        self._ending: set[asyncio.Task] = set()
        self._lingerers: set[asyncio.Task] = set()
        self._shadows: list[_Flight] = []  # stalled streams still written heartbeats (fl.q: their writer's queue)
        self._futs: set[asyncio.Future] = set()

    # --- waking ---------------------------------------------------------

    def _wake(self) -> None:
        for f in list(self._futs):
            if not f.done():
                f.set_result(None)

    async def _wait(self, until: float | None) -> None:
        """Waits until the clock reaches until, or a wake."""
        fut = asyncio.get_running_loop().create_future()
        self._futs.add(fut)

        def wake():
            if not fut.done():
                fut.set_result(None)
        h = self.c.timers.at(until, wake) if until is not None else None
        try:
            await fut
        finally:
            self._futs.discard(fut)
            if h is not None:
                h.cancel()

    def poke(self) -> None:
        self.poked = True
        self._wake()

    def beat_soon(self, s, after: float) -> None:
        super().beat_soon(s, after)
        self._wake()

    def handle(self, r, fl) -> None:
        super().handle(r, fl)
        self._wake()  # the sender (a draining answer) and lingerers look again

    # --- sessions -------------------------------------------------------

    def add(self, s) -> None:
        super().add(s)
        self._wake()
        if (self._task is None or self._task.done()) and not self.stopped:
            prev = list(self._ending)
            self._task = asyncio.get_running_loop().create_task(self._run(prev), name="lockd-keepalive")
            self._task.add_done_callback(_log_failure)

    def remove(self, s) -> None:
        super().remove(s)
        if not self.sessions:
            self._end_all()

    def _end_all(self) -> None:
        """No session is left: the keepalive task, and the streams left
        behind on moves (lingerers, shadow writers), are told to stop;
        settle() waits for them."""
        ts = [self._task] if self._task is not None else []
        self._task = None
        ts += list(self._lingerers)
        self._shadows.clear()
        for t in ts:
            t.cancel()
            self._ending.add(t)
            t.add_done_callback(self._ending.discard)

    async def settle(self) -> None:
        """Waits for the tasks that were told to stop (the last session ended)."""
        while self._ending:
            await asyncio.gather(*list(self._ending), return_exceptions=True)

    async def stop(self) -> None:
        self.stopped = True
        self._wake()
        self._end_all()
        await self.settle()
        while self._lingerers:
            await asyncio.gather(*list(self._lingerers), return_exceptions=True)

    # --- streams --------------------------------------------------------

    async def _run(self, prev) -> None:
        if prev:
            await asyncio.gather(*prev, return_exceptions=True)
        clock = self.c.clock
        attempt = 0
        while self.sessions and not self.stopped:
            start = clock.now()
            try:
                healthy, moved = await self.stream()
            except errors.Closed:
                return
            if self.stopped:
                return
            if moved:
                attempt = 0
                continue
            if healthy or clock.now() - start > 10:
                attempt = 0
            if not healthy or attempt > 0:
                if not await self.c._sleep(self.c._backoff(attempt)):
                    return
            attempt += 1

    async def stream(self):
        """Runs one KeepAlive stream until it breaks, the task is cancelled,
        or the SDK leaves its replica; returns (healthy, moved)."""
        c, clock = self.c, self.c.clock
        addr, stub = c.conn.pick()
        call = stub.KeepAlive(metadata=c.conn.metadata)
        self.gen += 1
        fl = _Flight(self.gen, clock.now())
        rt = asyncio.get_running_loop().create_task(self._receive(call, fl), name="lockd-keepalive-recv")
        moved = False
        try:
            moved = await self._send(addr, call, fl)
        finally:
            if moved:
                fl.left = True
                if fl.stalled:
                    self._add_shadow(fl, call)  # still written heartbeats; the lingerer cancels it in the end
                else:
                    try:
                        await call.done_writing()
                    except Exception:  # the stream broke meanwhile: the lingerer sees it
                        pass
                t = asyncio.get_running_loop().create_task(self._linger(call, rt, fl), name="lockd-keepalive-linger")
                self._lingerers.add(t)
                t.add_done_callback(self._lingerers.discard)
            else:
                call.cancel()
                await _end_task(rt)
        healthy = fl.replied
        if isinstance(fl.broken, grpc.RpcError) and not moved:
            err = errors.from_rpc(fl.broken)
            c.conn.after_error(addr, err)
            log.debug("keepalive stream broke: %s", err)
        return healthy, moved

    async def _receive(self, call, fl) -> None:
        clock = self.c.clock
        try:
            while True:
                r = await call.read()
                if r is grpc.aio.EOF:
                    break
                with fl.mu:
                    fl.replied = True
                    fl.last_recv = clock.now()
                self.handle(r, fl)
            fl.broken = "stream ended"
        except grpc.RpcError as e:
            fl.broken = e
        except asyncio.CancelledError:
            fl.broken = "cancelled"
            if cancelling():
                raise
        except Exception as e:  # never leave the stream without a reader
            log.exception("keepalive receiver failed")
            fl.broken = e
        finally:
            self._wake()

    async def _send(self, addr: str, call, fl) -> bool:
        """The sender loop of a stream; True when it left the replica on purpose."""
        c, clock = self.c, self.c.clock
        now = clock.now()
        for e in self.sessions.values():
            e[1] = now  # every session beats at once on a new stream
        next_id = 0
        drain_seen = False
        stall_done = False
        while True:
            if self.stopped:
                return False
            due = []
            now = clock.now()
            nxt = now + 3600
            for e in self.sessions.values():
                if now + beat_slack(e[0].interval) >= e[1]:
                    due.append(e[0])
                    e[1] = now + jitter(e[0].interval)
                nxt = min(nxt, e[1])
            for s in due:
                next_id += 1
                seq, acks = s._beat_state(fl.gen)
                sent = clock.now()
                with fl.mu:
                    fl.beats[next_id] = (s, sent, seq)
                try:
                    await call.write(pb.KeepAliveRequest(session_id=s.id, session_secret=s._secret,
                                                         request_id=next_id, ack=acks))
                except Exception as e:  # the stream broke (the reader reports how)
                    if fl.broken is None:
                        fl.broken = e if isinstance(e, grpc.RpcError) else "write failed"
                    return False
            await self._write_shadows(fl, due)
            # Forget heartbeats unanswered for a TTL; find a stall.
            oldest, stall, last_recv = forget_unanswered(fl, now)
            if c.conn.several and not stall_done and oldest is not None:
                at = max(oldest, last_recv) + stall
                if now >= at:
                    if c.conn.set_aside(addr):
                        log.debug("keepalive stream stalled: moving from %s", addr)
                        fl.stalled = True
                        return True
                    stall_done = True
                else:
                    nxt = min(nxt, at)
            if fl.broken is not None:
                return False
            if fl.draining and not drain_seen:
                drain_seen = True
                if c.conn.several and c.conn.set_aside(addr, draining=True):
                    log.debug("replica %s draining: moving", addr)
                    return True
            if not self.poked and not self.stopped:
                await self._wait(nxt)
            self.poked = False
            if fl.broken is not None:
                return False

    # --- a stall move keeps sending (C2 #ct2-failover) -------------------

    def _add_shadow(self, fl, call) -> None:
        """A writer task of its own writes the shadow's heartbeats: a replica
        that hangs stops granting flow control, and a write to it must never
        hold up the stream in use."""
        q: asyncio.Queue = asyncio.Queue(maxsize=SHADOW_QUEUE)
        t = asyncio.get_running_loop().create_task(self._shadow_writer(call, q), name="lockd-keepalive-shadow")
        self._lingerers.add(t)  # cancelled and awaited by stop, as lingerers are
        t.add_done_callback(self._lingerers.discard)
        super()._add_shadow(fl, q)

    async def _shadow_writer(self, call, q: asyncio.Queue) -> None:
        while True:
            req = await q.get()
            if req is None:
                return
            try:
                await call.write(req)
            except Exception:  # the stream ended: its lingerer sees it
                return

    def _stop_shadow_locked(self, fl) -> None:
        fl.sending = False
        if fl.q.full():  # make room for the end: a heartbeat dropped is never unsafe
            req = fl.q.get_nowait()
            with fl.mu:
                fl.beats.pop(req.request_id, None)
        fl.q.put_nowait(None)
        self._wake()  # its lingerer looks again

    async def _write_shadows(self, cur, due: list) -> None:
        """Hands the shadows their heartbeats; one the queue has no room for
        is not sent (never unsafe)."""
        if not due:
            return
        sent = False
        for sh in self._live_shadows(cur):
            for req in self._shadow_beats(sh, due):
                try:
                    sh.q.put_nowait(req)
                    sent = True
                except asyncio.QueueFull:
                    with sh.mu:
                        sh.beats.pop(req.request_id, None)
        if sent:
            self._wake()  # the lingerers look again: a timer to forget what was sent

    async def _linger(self, call, rt: asyncio.Task, fl) -> None:
        """Receives on a stream left on purpose until it is written nothing
        more and its heartbeats are answered or forgotten (a TTL after their
        send), it breaks, or stop."""
        clock = self.c.clock
        try:
            while not self.stopped and fl.broken is None:
                now = clock.now()
                until = None
                with fl.mu:
                    for rid, (s, sent, _) in list(fl.beats.items()):
                        if now >= sent + s.ttl:
                            del fl.beats[rid]
                            continue
                        until = sent + s.ttl if until is None else max(until, sent + s.ttl)
                if until is None and not fl.sending:
                    break
                await self._wait(until)  # None: a shadow with nothing in flight waits for a wake
        finally:
            call.cancel()
            await _end_task(rt)


def _log_failure(t: asyncio.Task) -> None:
    if not t.cancelled() and t.exception() is not None:
        log.error("lockd keepalive task failed: %r", t.exception())


async def _end_task(t: asyncio.Task) -> None:
    """Waits for t, which was told to end (its call cancelled); a
    cancellation of the waiting task cancels t too and is re-raised after t
    ended, so no task is left behind."""
    try:
        await asyncio.shield(t)
    except asyncio.CancelledError:
        if not cancelling():
            return  # t itself was cancelled
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        raise
