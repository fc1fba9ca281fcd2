"""lockd.aio's timing rules under a fake clock (docs/contracts/C2.md
#ct2-sdk): the aio heartbeat has its own scheduler (a task of the event
loop, waits on the fake clock through _aioclient.Sched), so the four rules
of tests/test_timing.py are checked again through it — deadline from the
send time, the halfway heartbeat before a short deadline, a lost notice
repeated until acknowledged on its stream, a revoke without notice ending
trust — with the same controls: each rule broken on purpose must fail its
check (AioControlTest)."""

import asyncio
import os
import subprocess
import sys
import time
import unittest
from unittest import mock

import lockd
import lockd.aio
from lockd import _keepalive, session

from .aiofake import AioFake
from .fake import FakeServer

# How long (real time) a check waits for the SDK's tasks to apply what the
# fake clock caused; a control waits this long before its check fails.
WAIT = 5.0


async def apoll(cond, timeout=10.0):
    """Waits (real time, yielding to the loop) until cond() holds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(0.005)
    return cond()


def start(**kw):
    clock = lockd.FakeClock()
    srv = FakeServer(clock, **kw)
    fk = AioFake(srv)
    c = lockd.aio.Client("127.0.0.1:1", clock=clock, _stub_factory=fk.stub, backoff=(0.01, 0.05))
    return c, clock, srv, fk


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 120))


class Checks:
    async def deadline_from_send_time(self):
        c, clock, srv, _ = start(ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        async with c:
            rtt, rem, margin = 1.0, 10.0, 0.5
            srv.during["OpenSession"] = lambda: clock.advance(rtt)
            t0 = clock.now()
            s = await c.session()
            self.assertEqual(clock.now() - t0, rtt)
            self.assertAlmostEqual(s.deadline, t0 + rem - margin, msg="open: deadline must count from the send")
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 1))
            srv.during["Acquire"] = lambda: clock.advance(rtt)
            sent = clock.now()
            lock = await s.acquire("k")
            self.assertAlmostEqual(s.deadline, sent + rem - margin, msg="acquire: deadline must count from the send")
            self.assertAlmostEqual(lock.deadline, sent + rem - margin)
            srv.during["Heartbeat"] = lambda: clock.advance(rtt)
            before = srv.heartbeats
            clock.advance(2.0)  # the next heartbeat is due
            sent = clock.now()
            self.assertTrue(await apoll(lambda: srv.heartbeats > before))
            self.assertTrue(await apoll(lambda: abs(s.deadline - (sent + rem - margin)) < 1e-9),
                            f"heartbeat: deadline now{s.deadline - clock.now():+}; want send + Remaining - margin "
                            f"= now{sent + rem - margin - clock.now():+}")

    async def heartbeat_before_short_deadline(self):
        c, clock, srv, _ = start(ttl=60.0, remaining=1.2, margin=0.5, interval=1.0)
        async with c:
            window = 1.2 - 0.5
            s = await c.session()
            lock = await s.acquire("k")
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 1))
            for i in range(8):
                now = clock.now()
                self.assertTrue(await apoll(lambda: clock.pending(now, now + window / 2 + 1e-9), timeout=WAIT),
                                f"step {i}: no heartbeat due within {window / 2}s of an answer leaving {window}s")
                clock.advance(window / 2)
                sent = clock.now()
                self.assertTrue(await apoll(lambda: abs(lock.deadline - (sent + window)) < 1e-9, timeout=WAIT),
                                f"step {i}: lock deadline sent{lock.deadline - sent:+}; want sent+{window}")
                self.assertTrue(lock.valid(), f"step {i}: lock lost: {lock.error}")

    async def lost_notice_redelivered(self):
        c, clock, srv, _ = start(ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        async with c:
            srv.send_held = False
            srv.drop_push = True
            s = await c.session()
            lock = await s.acquire("k")
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 1))
            n = srv.revoke(s.id, "k")
            clock.advance(2.0)
            self.assertTrue(await apoll(lambda: lock.lost.is_set(), timeout=WAIT),
                            "lock still trusted after the repeated notice")
            self.assertIsInstance(lock.error, lockd.LockLost)
            self.assertIn("revoked", str(lock.error))
            self.assertTrue(s.valid(), "the session must live on")
            self.assertTrue(await apoll(lambda: any(a == n.notice_id for _, a in srv.acks), timeout=WAIT),
                            "the notice was never acknowledged")
            gen = srv.streams[-1].gen
            self.assertEqual([g for g, a in srv.acks if a == n.notice_id][0], gen)
            self.assertFalse(srv.pending[s.id], "the server still holds the notice")

    async def revoke_without_notice_ends_trust(self):
        c, clock, srv, _ = start(ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        async with c:
            srv.strip_notices = True
            s = await c.session()
            revoked = await s.acquire("revoked")
            kept = await s.acquire("kept")
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 1))
            srv.revoke(s.id, "revoked")
            clock.advance(2.0)
            sent = clock.now()
            self.assertTrue(await apoll(lambda: revoked.lost.is_set(), timeout=WAIT), "revoked lock still trusted")
            self.assertIsInstance(revoked.error, lockd.LockLost)
            self.assertTrue(await apoll(lambda: abs(kept.deadline - (sent + 9.5)) < 1e-9, timeout=WAIT),
                            "the other lock was not extended")
            self.assertTrue(kept.valid() and s.valid())


class AioTimingTest(unittest.TestCase, Checks):
    def test_deadline_from_send_time(self):
        run(self.deadline_from_send_time())

    def test_heartbeat_before_short_deadline(self):
        run(self.heartbeat_before_short_deadline())

    def test_lost_notice_redelivered(self):
        run(self.lost_notice_redelivered())

    def test_revoke_without_notice_ends_trust(self):
        run(self.revoke_without_notice_ends_trust())

    def test_deadline_passes_without_answers(self):
        # Nothing answers: trust ends at the deadline, on the loop's timer;
        # lost is an asyncio.Event, the callback runs on the loop.
        async def body():
            c, clock, srv, _ = start(ttl=60.0, remaining=3.0, margin=0.5, interval=1.0)
            async with c:
                s = await c.session()
                lock = await s.acquire("k")
                srv.during["Heartbeat"] = lambda: (_ for _ in ()).throw(RuntimeError("no answer"))
                seen = []
                lock.on_lost(seen.append)
                clock.advance(2.6)
                await asyncio.wait_for(asyncio.gather(lock.lost.wait(), s.lost.wait()), WAIT)
                self.assertIsInstance(s.error, lockd.SessionExpired)
                self.assertFalse(lock.valid())
                self.assertEqual(len(seen), 1)
        run(body())


def _recv_time(sent, arrived):
    return arrived


class AioControlTest(unittest.TestCase, Checks):
    """Each rule broken on purpose: its check must fail."""

    def caught(self, what, coro):
        with self.assertRaises(AssertionError) as cm:
            run(coro)
        print(f"\naio control ({what}) caught: {str(cm.exception).splitlines()[0]}")

    def test_control_receive_time(self):
        with mock.patch.object(session, "trust_from", _recv_time):
            self.caught("deadline from the reply's arrival", self.deadline_from_send_time())

    def test_control_builtin_recvtime(self):
        env = dict(os.environ, LOCKD_PYSDK_CONTROL="recvtime")
        out = subprocess.run([sys.executable, "-m", "unittest",
                              "tests.test_aio_timing.AioTimingTest.test_deadline_from_send_time"],
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertNotEqual(out.returncode, 0, "the receive-time control was not caught")
        line = next((ln for ln in out.stderr.splitlines() if ln.startswith("AssertionError")), "")
        print(f"\naio control (LOCKD_PYSDK_CONTROL=recvtime) caught: {line}")

    def test_control_fixed_interval(self):
        with mock.patch.object(_keepalive.Keepaliver, "beat_before_deadline", lambda self, s: None):
            self.caught("no halfway heartbeat", self.heartbeat_before_short_deadline())

    def test_control_no_ack(self):
        orig = session.Session._lock_lost
        with mock.patch.object(session.Session, "_lock_lost", lambda self, n, gen: orig(self, n, 0)):
            self.caught("notices applied, never acknowledged", self.lost_notice_redelivered())

    def test_control_ignore_held(self):
        orig = session.Session._answer
        with mock.patch.object(session.Session, "_answer",
                               lambda self, sent, seq, live, rem, held: orig(self, sent, seq, live, rem, None)):
            self.caught("held set ignored", self.revoke_without_notice_ends_trust())


if __name__ == "__main__":
    unittest.main()
