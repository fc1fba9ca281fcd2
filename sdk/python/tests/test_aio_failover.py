"""lockd.aio's replica moves under a fake clock (C2 #ct2-failover, #ct2-sdk
rule 8): two addresses of one fake backend. A draining answer moves the
KeepAlive stream to the other address, whose answers keep the lock; a
replica whose stream breaks with UNAVAILABLE is left the same way. No task
is left after the client's close. (test/sdk's FailoverTest stops and kills
real replicas under the sync SDK; the aio stream loop is its own code.)"""

import asyncio
import unittest

import lockd
import lockd.aio

from . import integration as it
from .aiofake import AioFake
from .fake import FakeServer
from .test_aio_cancel import others
from .test_aio_timing import WAIT, apoll, run

A, B = "127.0.0.1:1", "127.0.0.1:2"


def start():
    clock = lockd.FakeClock()
    srv = FakeServer(clock, ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
    fakes = {A: AioFake(srv), B: AioFake(srv)}
    c = lockd.aio.Client(f"{A},{B}", clock=clock, _stub_factory=fakes.__getitem__, backoff=(0.01, 0.05))
    return c, clock, srv, fakes



class AioFailoverTest(unittest.TestCase):
    def check_move(self, leave):
        async def body():
            c, clock, srv, fakes = start()
            async with c:
                s = await c.session()
                lock = await s.acquire("k")
                self.assertTrue(await apoll(lambda: srv.heartbeats >= 1 and fakes[A].streams))
                self.assertEqual(fakes[B].streams, [], "a stream on the second address before any move")
                leave(fakes[A], clock)
                # A re-dial after a failed stream waits its backoff on the
                # (fake) clock: move it in small steps until the stream moved.
                for _ in range(100):
                    if await apoll(lambda: fakes[B].streams, timeout=0.05):
                        break
                    clock.advance(0.02)
                self.assertTrue(fakes[B].streams, "the stream never moved to B")
                # Every session beats at once on the new stream: its answer
                # (from B) renews the lock from that send.
                sent = clock.now()
                self.assertTrue(await apoll(lambda: abs(lock.deadline - (sent + 9.5)) < 1e-9, timeout=WAIT),
                                f"lock not renewed through B: deadline now{lock.deadline - clock.now():+}")
                self.assertTrue(lock.valid() and s.valid(), lock.error)
                before = srv.heartbeats
                clock.advance(2.0)  # the schedule goes on, on B
                self.assertTrue(await apoll(lambda: srv.heartbeats > before, timeout=WAIT))
                self.assertEqual(c.conn.pick()[0], B)
            self.assertEqual(others(), set(), "a task is left after the client's close")
        run(body())

    def test_drain_moves(self):
        def drain(fa, clock):
            fa.draining = True
            clock.advance(2.0)  # the next heartbeat's answer says draining
        self.check_move(drain)

    def test_broken_stream_moves(self):
        def kill(fa, clock):
            fa.down = True
            for st in fa.streams:
                st.cancel()  # the stream ends; its re-dial to A breaks with UNAVAILABLE
        self.check_move(kill)


@it.need("PYSDK_BACKENDS", "PYSDK_CONTROL")
class AioFailoverRealTest(unittest.TestCase):
    def test_kill_replica(self):
        """Against two real replicas: the one the watch uses is killed (the
        one in use, unless a stall already moved the SDK); the lock is renewed
        by the other, the SDK ends there, and the watch resumes there (etcd:
        every event once; PostgreSQL: RESYNC first)."""
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                run(self.kill(b))

    async def kill(self, b):
        replicas = it.aio_replicas(b).split(",")
        async with lockd.aio.Client(it.aio_replicas(b), backoff=(0.01, 0.2)) as c:
            async with await c.session() as s:
                lock = await s.acquire("afo/held")
                losses = []
                lock.on_lost(losses.append)
                w = await c.watch("afo/ev/")
                # The replica killed is the watch's, fixed once the watch is
                # established (nothing reads it before the kill, so no silence
                # timer can move it). It is replica 0 unless the KeepAlive
                # stream stalled before the watch opened: a stall moves the
                # SDK on (C2 #ct2-failover), which a loaded machine does.
                killed = w._addr
                self.assertIn(killed, replicas)
                other = replicas[1 - replicas.index(killed)]
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, it.control, "aio-" + b, replicas.index(killed), "kill")
                after = c.clock.now()
                # Renewed from a heartbeat sent after the kill: only the other
                # replica can have answered it.
                self.assertTrue(await apoll(lambda: lock.deadline > after + it.TTL - it.MARGIN - 0.05,
                                            timeout=3 * it.TTL),
                                f"lock not renewed by the other replica: deadline now{lock.deadline - c.clock.now():+.2f}")
                # The SDK ends on the live replica. It may try the dead one
                # once more first: a stall of the other replica's stream
                # (a loaded machine) moves to a replica no call has yet
                # found dead, and that call then fails it.
                self.assertTrue(await apoll(lambda: c.conn.pick()[0] == other, timeout=3 * it.TTL),
                                f"the SDK did not settle on the live replica {other}: uses {c.conn.pick()[0]}")
                self.assertEqual(losses, [])
                self.assertTrue(lock.valid() and s.valid())
                if b == "pg":
                    ev = await asyncio.wait_for(w.__anext__(), 30)
                    self.assertEqual(str(ev.kind), "resync")
                key = "afo/ev/k"
                await (await s.acquire(key)).release()
                kinds = [await asyncio.wait_for(w.__anext__(), 30) for _ in range(2)]
                self.assertEqual([(str(e.kind), e.key) for e in kinds], [("acquired", key), ("released", key)])
                self.assertEqual(w._addr, other, "the watch did not resume on the live replica")
                await w.aclose()
                await lock.release()
        self.assertEqual(others(), set(), "a task is left after the client's close")


if __name__ == "__main__":
    unittest.main()
