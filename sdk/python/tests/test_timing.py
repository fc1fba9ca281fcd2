"""The timing rules of docs/contracts/C2.md #ct2-sdk under a fake clock, the
equivalents of the Go SDK's client.TestDeadlineFromSendTime,
TestHeartbeatBeforeShortDeadline, TestLostNoticeRedelivered and
TestRevokeWithoutNoticeEndsTrust. Each rule also has a control: the test run
against an SDK with that rule broken on purpose must fail (ControlTest)."""

import os
import subprocess
import sys
import unittest
from unittest import mock

import lockd
from lockd import _keepalive, session

from .fake import FakeServer
from .util import poll


# How long (real time) a check waits for the SDK's threads to apply what the
# fake clock caused; a control waits this long before its check fails.
WAIT = 5.0


def start(test, **kw):
    clock = lockd.FakeClock()
    srv = FakeServer(clock, **kw)
    c = lockd.Client("127.0.0.1:1", clock=clock, _stub_factory=srv.stub, backoff=(0.01, 0.05))
    test.addCleanup(c.close)
    return c, clock, srv


class Checks:
    """The checks, shared by the tests and their controls."""

    def deadline_from_send_time(self):
        # The clock moves 1 s while each request is at the server: every
        # deadline must still be send + Remaining - margin.
        c, clock, srv = start(self, ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        rtt, rem, margin = 1.0, 10.0, 0.5
        srv.during["OpenSession"] = lambda: clock.advance(rtt)
        t0 = clock.now()
        s = c.session()
        self.assertEqual(clock.now() - t0, rtt)
        self.assertAlmostEqual(s.deadline, t0 + rem - margin, msg="open: deadline must count from the send")
        # The first heartbeat goes at once on the new stream; it is at the
        # server while the clock moves.
        self.assertTrue(poll(lambda: srv.heartbeats >= 1))
        srv.during["Acquire"] = lambda: clock.advance(rtt)
        sent = clock.now()
        lock = s.acquire("k")
        self.assertAlmostEqual(s.deadline, sent + rem - margin, msg="acquire: deadline must count from the send")
        self.assertAlmostEqual(lock.deadline, sent + rem - margin)
        # A heartbeat that spends rtt at the server.
        srv.during["Heartbeat"] = lambda: clock.advance(rtt)
        before = srv.heartbeats
        sent = clock.now()
        clock.advance(2.0)  # the next heartbeat is due
        sent = clock.now()
        self.assertTrue(poll(lambda: srv.heartbeats > before))
        self.assertTrue(poll(lambda: abs(s.deadline - (sent + rem - margin)) < 1e-9),
                        f"heartbeat: deadline now{s.deadline - clock.now():+}; want send + Remaining - margin "
                        f"= now{sent + rem - margin - clock.now():+}")

    def heartbeat_before_short_deadline(self):
        # Remaining leaves 0.7 s of trust per answer, less than the 1 s
        # interval: the next heartbeat must come halfway to the deadline.
        c, clock, srv = start(self, ttl=60.0, remaining=1.2, margin=0.5, interval=1.0)
        window = 1.2 - 0.5
        s = c.session()
        lock = s.acquire("k")
        self.assertTrue(poll(lambda: srv.heartbeats >= 1))
        for i in range(8):
            now = clock.now()
            self.assertTrue(poll(lambda: clock.pending(now, now + window / 2 + 1e-9), timeout=WAIT),
                            f"step {i}: no heartbeat due within {window / 2}s of an answer leaving {window}s")
            clock.advance(window / 2)
            sent = clock.now()
            self.assertTrue(poll(lambda: abs(lock.deadline - (sent + window)) < 1e-9, timeout=WAIT),
                            f"step {i}: lock deadline sent{lock.deadline - sent:+}; want sent+{window}")
            self.assertTrue(lock.valid(), f"step {i}: lock lost: {lock.error}")

    def lost_notice_redelivered(self):
        # The pushed notice vanishes; the server (answering without held, as
        # an older server) repeats it in every answer until acknowledged.
        c, clock, srv = start(self, ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        srv.send_held = False
        srv.drop_push = True
        s = c.session()
        lock = s.acquire("k")
        self.assertTrue(poll(lambda: srv.heartbeats >= 1))
        n = srv.revoke(s.id, "k")
        clock.advance(2.0)  # the next heartbeat; its answer repeats the notice
        self.assertTrue(poll(lambda: lock.lost.is_set(), timeout=WAIT), "lock still trusted after the repeated notice")
        self.assertIsInstance(lock.error, lockd.LockLost)
        self.assertIn("revoked", str(lock.error))
        self.assertTrue(s.valid(), "the session must live on")
        # Acknowledged at once, on the stream the notice came on.
        self.assertTrue(poll(lambda: any(a == n.notice_id for _, a in srv.acks), timeout=WAIT),
                        "the notice was never acknowledged")
        gen = srv.streams[-1].gen
        self.assertEqual([g for g, a in srv.acks if a == n.notice_id][0], gen)
        self.assertFalse(srv.pending[s.id], "the server still holds the notice")

    def revoke_without_notice_ends_trust(self):
        # No notice ever arrives; the next answer's held set no longer lists
        # the revoked lock: it is lost, the other lock is kept and extended.
        c, clock, srv = start(self, ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        srv.strip_notices = True
        s = c.session()
        revoked = s.acquire("revoked")
        kept = s.acquire("kept")
        self.assertTrue(poll(lambda: srv.heartbeats >= 1))
        srv.revoke(s.id, "revoked")
        clock.advance(2.0)
        sent = clock.now()
        self.assertTrue(poll(lambda: revoked.lost.is_set(), timeout=WAIT), "revoked lock still trusted")
        self.assertIsInstance(revoked.error, lockd.LockLost)
        self.assertTrue(poll(lambda: abs(kept.deadline - (sent + 9.5)) < 1e-9, timeout=WAIT),
                        "the other lock was not extended")
        self.assertTrue(kept.valid() and s.valid())


class TimingTest(unittest.TestCase, Checks):
    def test_deadline_from_send_time(self):
        self.deadline_from_send_time()

    def test_heartbeat_before_short_deadline(self):
        self.heartbeat_before_short_deadline()

    def test_lost_notice_redelivered(self):
        self.lost_notice_redelivered()

    def test_revoke_without_notice_ends_trust(self):
        self.revoke_without_notice_ends_trust()

    def test_omitted_past_max_hold_is_max_hold(self):
        # C2 #ct2-maxhold-sdk (MAXHOLD-1): an answer omits a lock granted
        # with max_hold m and no notice comes (as when the server's held set
        # saw the backend's revoke before its lock-loss watch made the
        # notice): MaxHold once the clock reads the Acquire's send time + m,
        # plain LockLost before (the control, 1 ms before).
        c, clock, srv = start(self, ttl=60.0, remaining=30.0, margin=0.5, interval=2.0)
        srv.strip_notices = True
        hold = 5.0
        s = c.session()
        t0 = clock.now()  # both Acquires are sent at t0: the clock does not move
        early = s.acquire("early", max_hold=hold)
        late = s.acquire("late", max_hold=hold)
        self.assertTrue(poll(lambda: srv.heartbeats >= 1))
        srv.revoke(s.id, "early")
        clock.advance(hold - 0.001)  # the next heartbeat goes at t0 + m - 1 ms
        sent = clock.now()
        self.assertTrue(poll(lambda: early.lost.is_set(), timeout=WAIT), "early lock still trusted after its revoke")
        self.assertIsInstance(early.error, lockd.LockLost)
        self.assertNotIsInstance(early.error, lockd.MaxHold,
                                 f"omitted at t0 + {sent - t0}, before the hold could end it: {early.error!r}")
        # That heartbeat's answer (listing late) applied: none composed
        # before late's revoke is left on its way.
        self.assertTrue(poll(lambda: abs(late.deadline - (sent + 29.5)) < 1e-9, timeout=WAIT))
        srv.revoke(s.id, "late")
        clock.advance(2.0)
        self.assertTrue(poll(lambda: late.lost.is_set(), timeout=WAIT), "late lock still trusted after its revoke")
        self.assertIsInstance(late.error, lockd.MaxHold,
                              f"omitted at t0 + {clock.now() - t0}, past max_hold {hold}, no notice: {late.error!r}")
        self.assertTrue(s.valid(), "the session must live on")

    def test_deadline_passes_without_answers(self):
        # Nothing answers: trust ends at the deadline, on the SDK's timer.
        c, clock, srv = start(self, ttl=60.0, remaining=3.0, margin=0.5, interval=1.0)
        s = c.session()
        lock = s.acquire("k")
        srv.during["Heartbeat"] = lambda: (_ for _ in ()).throw(RuntimeError("no answer"))
        seen = []
        lock.on_lost(seen.append)
        clock.advance(2.6)
        self.assertTrue(poll(lambda: lock.lost.is_set() and s.lost.is_set(), timeout=WAIT))
        self.assertIsInstance(s.error, lockd.SessionExpired)
        self.assertFalse(lock.valid())
        self.assertEqual(len(seen), 1)

    def test_timing_settings_refused(self):
        with self.assertRaises(lockd.InvalidArgument):
            lockd.Client("127.0.0.1:1", ttl=4, safety_margin=2)
        with self.assertRaises(lockd.InvalidArgument):
            lockd.Client("127.0.0.1:1", ttl=4, safety_margin=1, heartbeat_interval=3)
        with self.assertRaises(lockd.InvalidArgument):
            lockd.Client("127.0.0.1:1", heartbeat_interval=0.05)


def _recv_time(sent, arrived):
    return arrived


class ControlTest(unittest.TestCase, Checks):
    """Each rule broken on purpose: its check must fail."""

    def control(self, check, *patches):
        with self.assertRaises(AssertionError) as cm:
            with mock.patch.multiple(*patches[0]) if patches else mock.MagicMock():
                check()
        print(f"\ncontrol caught: {str(cm.exception).splitlines()[0]}")

    def test_control_receive_time(self):
        with mock.patch.object(session, "trust_from", _recv_time):
            with self.assertRaises(AssertionError) as cm:
                self.deadline_from_send_time()
        print(f"\ncontrol (deadline from the reply's arrival) caught: {str(cm.exception).splitlines()[0]}")

    def test_control_builtin_recvtime(self):
        # The SDK's own receive-time control (LOCKD_PYSDK_CONTROL=recvtime,
        # for runs outside these tests) is caught by the send-time check.
        env = dict(os.environ, LOCKD_PYSDK_CONTROL="recvtime")
        out = subprocess.run([sys.executable, "-m", "unittest", "tests.test_timing.TimingTest.test_deadline_from_send_time"],
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertNotEqual(out.returncode, 0, "the receive-time control was not caught")
        line = next((ln for ln in out.stderr.splitlines() if ln.startswith("AssertionError")), "")
        print(f"\ncontrol (LOCKD_PYSDK_CONTROL=recvtime) caught: {line}")

    def test_control_fixed_interval(self):
        with mock.patch.object(_keepalive.Keepaliver, "beat_before_deadline", lambda self, s: None):
            with self.assertRaises(AssertionError) as cm:
                self.heartbeat_before_short_deadline()
        print(f"\ncontrol (no halfway heartbeat) caught: {str(cm.exception).splitlines()[0]}")

    def test_control_no_ack(self):
        orig = session.Session._lock_lost
        with mock.patch.object(session.Session, "_lock_lost", lambda self, n, gen: orig(self, n, 0)):
            with self.assertRaises(AssertionError) as cm:
                self.lost_notice_redelivered()
        print(f"\ncontrol (notices applied, never acknowledged) caught: {str(cm.exception).splitlines()[0]}")

    def test_control_ignore_held(self):
        orig = session.Session._answer
        with mock.patch.object(session.Session, "_answer",
                               lambda self, sent, seq, live, rem, held: orig(self, sent, seq, live, rem, None)):
            with self.assertRaises(AssertionError) as cm:
                self.revoke_without_notice_ends_trust()
        print(f"\ncontrol (held set ignored) caught: {str(cm.exception).splitlines()[0]}")


if __name__ == "__main__":
    unittest.main()
