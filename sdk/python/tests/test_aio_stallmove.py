"""C2 #ct2-failover, "a stall move keeps sending", through lockd.aio under
a fake clock: tests/test_stallmove.py's scenario (the Go SDK's
client.TestStallMoveKeepsSlowReplica) with the aio keepalive task. Replica A
answers later than the stall bound, in the instant the client moved; the
replica moved to (B) answers nothing. The session must live on A's answers
to heartbeats sent after the move; once B answers, nothing more is sent to
A. A control without the shadow (the stalled stream sent nothing more) must
fail. Two liveness checks (issue 21): B's error answers do not stop the
sends to A (only a live heartbeat answer does), and a heartbeat A never
answers is forgotten a TTL after its send and the next one sent there."""

import asyncio
import unittest
from unittest import mock

import lockd
import lockd.aio
from lockd import _aiokeepalive

from .aiofake import AioFake
from .fake import FakeServer
from .test_aio_cancel import others
from .test_aio_timing import apoll, run

A, B = "127.0.0.1:1", "127.0.0.1:2"


class Checks:
    async def stall_move_keeps_slow_replica(self, close_after_move=False):
        ttl, interval = 10.0, 1.0
        clock = lockd.FakeClock()
        a = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        b = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        fa, fb = AioFake(a), AioFake(b)
        c = lockd.aio.Client(f"{A},{B}", clock=clock, _stub_factory=lambda addr: fa if addr == A else fb,
                             backoff=(0.01, 0.05))
        async with c:
            s = await c.session()
            self.assertTrue(await apoll(lambda: a.heartbeats >= 1), "no heartbeat answered by A")
            lock = await s.acquire("k")
            b.held[s.id] = dict(a.held[s.id])  # one backend: B knows the grant too

            fa.holding, fb.holding = 1, -1  # A holds its next heartbeat; B every one
            clock.advance(interval)  # the next heartbeat goes to A, which holds it
            self.assertTrue(await apoll(lambda: fa.held), "no heartbeat held on A")
            clock.advance(interval / 2)  # the stall bound: the client moves to B
            self.assertTrue(await apoll(lambda: fb.held), "no heartbeat reached B after the stall bound: no move")
            moved = clock.now()
            answered = a.heartbeats
            fa.release()  # A answers, in the instant of the move
            self.assertTrue(await apoll(lambda: a.heartbeats > answered), "A's held heartbeat not answered")
            self.assertTrue(await apoll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                            "A's held heartbeat's answer not applied")  # see the steps below
            if close_after_move:
                # The last session's close ends the stalled stream's shadow
                # and lingerer with the keepalive task: no task is left.
                self.assertTrue(c.ka._lingerers, "no lingerer after the stall move (test setup)")
                fb.release()
                await s.close()
                self.assertEqual(others(), set(), "a task is left after the last session's close")
                return

            for i in range(12):  # B answers nothing for more than a TTL; A answers what it is sent
                n = a.heartbeats
                clock.advance(interval)
                self.assertTrue(await apoll(lambda: a.heartbeats > n, timeout=5.0),
                                f"step {i}: no heartbeat answered by A {clock.now() - moved:.1f}s after the move")
                # The client has applied A's answer too (the shadow lists no beat in
                # flight): a session with one in flight there is not sent another, so
                # moving the clock before that starves A (1 of 40 runs under load,
                # "step 4: no heartbeat answered by A", clean-clone run r27).
                self.assertTrue(await apoll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                                f"step {i}: A's answer not applied")
                self.assertTrue(s.valid(), f"step {i}: session lost {clock.now() - moved:.1f}s after the move: {s._err}")
                self.assertIsNone(lock.error, f"step {i}: lock lost {clock.now() - moved:.1f}s after the move")
            self.assertTrue(await apoll(lambda: lock.deadline > moved + ttl),
                            f"lock deadline {lock.deadline - moved:.1f}s after the move: want beyond the TTL")
            self.assertEqual([ack for ack in a.acks if ack[0] != a.streams[0].gen], [],
                             "an acknowledgement sent on the stalled stream")

            fb.release()  # B answers: from the next heartbeat on, A is sent nothing more
            self.assertTrue(await apoll(lambda: b.heartbeats > 0), "B answered nothing after its release")
            clock.advance(interval)
            self.assertTrue(await apoll(lambda: not c.ka._shadows),
                            "the stalled stream is still sent heartbeats after B answered")
            self.assertTrue(s.valid(), f"session lost after B answered: {s._err}")
            self.assertIsNone(lock.error)
        self.assertEqual(others(), set(), "a task is left after the client's close")

    async def moved(self, clock, a, b, fa, fb, c, b_fails):
        """The aio client c moved from A to B on a stall (A's heartbeat held
        until then); B holds every heartbeat, or with b_fails answers each
        with an error."""
        interval = 1.0
        s = await c.session()
        self.assertTrue(await apoll(lambda: a.heartbeats >= 1), "no heartbeat answered by A")
        await s.acquire("k")
        b.held[s.id] = dict(a.held[s.id])
        fa.holding = 1
        if b_fails:
            b.fail_heartbeats = True
        else:
            fb.holding = -1
        clock.advance(interval)
        self.assertTrue(await apoll(lambda: fa.held), "no heartbeat held on A")
        clock.advance(interval / 2)
        self.assertTrue(await apoll(lambda: b.failed > 0 if b_fails else fb.held), "no heartbeat reached B: no move")
        return s

    async def error_answers_keep_sending(self):
        ttl, interval = 10.0, 1.0
        clock = lockd.FakeClock()
        a = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        b = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        fa, fb = AioFake(a), AioFake(b)
        c = lockd.aio.Client(f"{A},{B}", clock=clock, _stub_factory=lambda addr: fa if addr == A else fb,
                             backoff=(0.01, 0.05))
        async with c:
            s = await self.moved(clock, a, b, fa, fb, c, b_fails=True)
            moved = clock.now()
            answered = a.heartbeats
            fa.release()
            self.assertTrue(await apoll(lambda: a.heartbeats > answered), "A's held heartbeat not answered")
            self.assertTrue(await apoll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                            "A's held heartbeat's answer not applied")  # see the steps below
            for i in range(12):  # B answers errors: not live answers, so A is still sent heartbeats
                n = a.heartbeats
                clock.advance(interval)
                self.assertTrue(await apoll(lambda: a.heartbeats > n, timeout=5.0),
                                f"step {i}: no heartbeat answered by A {clock.now() - moved:.1f}s after the move (B answers errors)")
                # As above: A's answer applied before the clock moves.
                self.assertTrue(await apoll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                                f"step {i}: A's answer not applied")
                self.assertTrue(s.valid(), f"step {i}: session lost: {s._err}")
            b.fail_heartbeats = False  # B's first live answer stops them
            clock.advance(interval)
            self.assertTrue(await apoll(lambda: b.heartbeats > 0), "B answered nothing live")
            clock.advance(interval)
            self.assertTrue(await apoll(lambda: not c.ka._shadows), "the stalled stream is still sent heartbeats after B answered live")

    async def unanswered_shadow_heartbeat_forgotten(self):
        ttl, interval = 10.0, 1.0
        clock = lockd.FakeClock()
        a = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        b = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        fa, fb = AioFake(a), AioFake(b)
        c = lockd.aio.Client(f"{A},{B}", clock=clock, _stub_factory=lambda addr: fa if addr == A else fb,
                             backoff=(0.01, 0.05))
        async with c:
            s = await self.moved(clock, a, b, fa, fb, c, b_fails=False)
            fa.holding = -1  # A answers nothing from now on (its held heartbeat neither), nor does B
            self.assertTrue(await apoll(lambda: len(c.ka._shadows) == 1), "the stalled stream is not sent heartbeats")
            sh = c.ka._shadows[0]
            first, moved = sh.next_id, clock.now()
            for i in range(int(2.5 * ttl / interval)):
                await s.acquire(f"x{i}")  # a grant's answer extends the session (C2 #ct2-deadline)
                clock.advance(interval)
                self.assertTrue(await apoll(lambda: c.ka.sessions[s.id][1] > clock.now()),
                                f"step {i}: the due heartbeat not sent {clock.now() - moved:.0f}s after the move")
            self.assertTrue(await apoll(lambda: sh.next_id >= first + 2, timeout=5.0),
                            f"{clock.now() - moved:.0f}s after the move, {sh.next_id - first} heartbeat(s) sent on the "
                            f"stalled stream that answers nothing; want 2 (each forgotten a TTL after its send, the next sent)")
            self.assertTrue(s.valid(), f"session lost: {s._err}")
            fa.release()
            fb.release()


class AioStallMoveTest(unittest.TestCase, Checks):
    def test_error_answers_keep_sending(self):
        run(self.error_answers_keep_sending())

    def test_unanswered_shadow_heartbeat_forgotten(self):
        run(self.unanswered_shadow_heartbeat_forgotten())

    def test_stall_move_keeps_slow_replica(self):
        run(self.stall_move_keeps_slow_replica())

    def test_close_after_move_leaves_no_task(self):
        run(self.stall_move_keeps_slow_replica(close_after_move=True))

    def test_control_no_shadow(self):
        with mock.patch.object(_aiokeepalive.Keepaliver, "_add_shadow", lambda self, fl, call: None):
            with self.assertRaises(AssertionError) as cm:
                run(self.stall_move_keeps_slow_replica())
        print(f"\naio control (a stalled stream sent nothing more) caught: {str(cm.exception).splitlines()[0]}")


if __name__ == "__main__":
    unittest.main()
