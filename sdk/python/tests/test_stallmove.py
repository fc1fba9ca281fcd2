"""C2 #ct2-failover, "a stall move keeps sending", under a fake clock: the
equivalent of the Go SDK's client.TestStallMoveKeepsSlowReplica (issue 21);
lockd.aio's is tests/test_aio_stallmove.py. Replica A answers later than the
stall bound, in the instant the client moved; the replica moved to (B)
answers nothing. The session must live on A's answers to heartbeats sent
after the move; once B answers, nothing more is sent to A."""

import threading
import unittest

import lockd

from .fake import FakeServer
from .util import poll

A, B = "127.0.0.1:1", "127.0.0.1:2"


def hold(srv, once):
    """Holds the heartbeats that reach srv (only the next one when once)
    until the returned event is set; entered is set when one is held."""
    entered, release = threading.Event(), threading.Event()

    def hook():
        entered.set()
        if once:
            srv.during.pop("Heartbeat", None)
        release.wait()
    srv.during["Heartbeat"] = hook
    return entered, release


class StallMoveTest(unittest.TestCase):
    def test_stall_move_keeps_slow_replica(self):
        ttl, interval = 10.0, 1.0
        clock = lockd.FakeClock()
        a = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        b = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        c = lockd.Client(f"{A},{B}", clock=clock, _stub_factory=lambda addr: a if addr == A else b, backoff=(0.01, 0.05))
        self.addCleanup(c.close)
        s = c.session()
        self.assertTrue(poll(lambda: a.heartbeats >= 1), "no heartbeat answered by A")
        lock = s.acquire("k")
        b.held[s.id] = dict(a.held[s.id])  # one backend: B knows the grant too

        held_a, release_a = hold(a, once=True)
        self.addCleanup(release_a.set)
        held_b, release_b = hold(b, once=False)
        self.addCleanup(release_b.set)  # before c.close (cleanups run last first)
        clock.advance(interval)  # the next heartbeat goes to A, which holds it
        self.assertTrue(poll(held_a.is_set), "no heartbeat held on A")
        clock.advance(interval / 2)  # the stall bound: the client moves to B
        self.assertTrue(poll(held_b.is_set), "no heartbeat reached B after the stall bound: the client did not move")
        moved = clock.now()
        answered = a.heartbeats
        release_a.set()  # A answers, in the instant of the move
        self.assertTrue(poll(lambda: a.heartbeats > answered), "A's held heartbeat not answered")
        self.assertTrue(poll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                        "A's held heartbeat's answer not applied")  # see the steps below

        for i in range(12):  # B answers nothing for more than a TTL; A answers what it is sent
            n = a.heartbeats
            clock.advance(interval)
            self.assertTrue(poll(lambda: a.heartbeats > n, timeout=5.0),
                            f"step {i}: no heartbeat answered by A {clock.now() - moved:.1f}s after the move")
            # The client has applied A's answer too (the shadow lists no beat in
            # flight): a session with one in flight there is not sent another, so
            # moving the clock before that starves A (1 of 40 runs under load,
            # "step 4: no heartbeat answered by A", clean-clone run r27).
            self.assertTrue(poll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                            f"step {i}: A's answer not applied")
            self.assertTrue(s.valid(), f"step {i}: session lost {clock.now() - moved:.1f}s after the move: {s._err}")
            self.assertIsNone(lock.error, f"step {i}: lock lost {clock.now() - moved:.1f}s after the move")
        self.assertTrue(poll(lambda: lock.deadline > moved + ttl),
                        f"lock deadline {lock.deadline - moved:.1f}s after the move: want beyond the TTL")
        self.assertEqual([ack for ack in a.acks if ack[0] != a.streams[0].gen], [], "an acknowledgement sent on the stalled stream")

        # B answers: from the next heartbeat on, A is sent nothing more.
        release_b.set()
        self.assertTrue(poll(lambda: b.heartbeats > 0), "B answered nothing after its release")
        clock.advance(interval)
        self.assertTrue(poll(lambda: not c.ka._shadows), "the stalled stream is still sent heartbeats after B answered")
        self.assertTrue(s.valid(), f"session lost after B answered: {s._err}")
        self.assertIsNone(lock.error)

    def _moved(self, b_fails):
        """A client moved from A to B on a stall: A held its heartbeat until
        the move (released then: it answers in the instant of the move) and
        answers the later ones; B holds every heartbeat, or with b_fails
        answers each with an error."""
        ttl, interval = 10.0, 1.0
        clock = lockd.FakeClock()
        a = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        b = FakeServer(clock, ttl=ttl, remaining=ttl, margin=0.5, interval=interval)
        c = lockd.Client(f"{A},{B}", clock=clock, _stub_factory=lambda addr: a if addr == A else b, backoff=(0.01, 0.05))
        self.addCleanup(c.close)
        s = c.session()
        self.assertTrue(poll(lambda: a.heartbeats >= 1), "no heartbeat answered by A")
        lock = s.acquire("k")
        b.held[s.id] = dict(a.held[s.id])
        held_a, release_a = hold(a, once=True)
        self.addCleanup(release_a.set)
        if b_fails:
            b.fail_heartbeats = True
            reached = lambda: b.failed > 0
        else:
            held_b, release_b = hold(b, once=False)
            self.addCleanup(release_b.set)
            reached = held_b.is_set
        clock.advance(interval)
        self.assertTrue(poll(held_a.is_set), "no heartbeat held on A")
        clock.advance(interval / 2)
        self.assertTrue(poll(reached), "no heartbeat reached B after the stall bound: the client did not move")
        return clock, a, b, c, s, lock, release_a

    def test_error_answers_keep_sending(self):
        """B answers every heartbeat with an error: not a live answer, so the
        stalled stream is still sent heartbeats (C2 #ct2-failover); before,
        any message of B stopped them."""
        ttl, interval = 10.0, 1.0
        clock, a, b, c, s, lock, release_a = self._moved(b_fails=True)
        moved = clock.now()
        answered = a.heartbeats
        release_a.set()
        self.assertTrue(poll(lambda: a.heartbeats > answered), "A's held heartbeat not answered")
        self.assertTrue(poll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                        "A's held heartbeat's answer not applied")  # see the steps below
        for i in range(12):
            n = a.heartbeats
            clock.advance(interval)
            self.assertTrue(poll(lambda: a.heartbeats > n, timeout=5.0),
                            f"step {i}: no heartbeat answered by A {clock.now() - moved:.1f}s after the move (B answers errors)")
            # As above: A's answer applied before the clock moves.
            self.assertTrue(poll(lambda: all(not sh.beats for sh in c.ka._shadows), timeout=5.0),
                            f"step {i}: A's answer not applied")
            self.assertTrue(s.valid(), f"step {i}: session lost {clock.now() - moved:.1f}s after the move: {s._err}")
        self.assertTrue(poll(lambda: lock.deadline > moved + ttl),
                        f"lock deadline {lock.deadline - moved:.1f}s after the move: want beyond the TTL")
        b.fail_heartbeats = False  # B's first live answer stops the sends to A
        clock.advance(interval)
        self.assertTrue(poll(lambda: b.heartbeats > 0), "B answered nothing live")
        clock.advance(interval)
        self.assertTrue(poll(lambda: not c.ka._shadows), "the stalled stream is still sent heartbeats after B answered live")

    def test_unanswered_shadow_heartbeat_forgotten(self):
        """A answers nothing after the move (its held heartbeat neither), B
        neither; grants on B keep the session. A heartbeat unanswered on the
        stalled stream is forgotten a TTL after its send and the session is
        sent the next one there (C2 #ct2-failover); before, the first one
        sent after the move was never forgotten and nothing more was sent."""
        ttl, interval = 10.0, 1.0
        clock, a, b, c, s, lock, release_a = self._moved(b_fails=False)
        self.assertTrue(poll(lambda: len(c.ka._shadows) == 1), "the stalled stream is not sent heartbeats")
        sh = c.ka._shadows[0]
        first = sh.next_id  # the heartbeat held on A when the client moved
        moved = clock.now()
        for i in range(int(2.5 * ttl / interval)):
            s.acquire(f"x{i}")  # a grant's answer extends the session (C2 #ct2-deadline)
            clock.advance(interval)
            self.assertTrue(poll(lambda: c.ka.sessions[s.id][1] > clock.now()),
                            f"step {i}: the due heartbeat not sent {clock.now() - moved:.0f}s after the move")
        self.assertTrue(poll(lambda: sh.next_id >= first + 2, timeout=5.0),
                        f"{clock.now() - moved:.0f}s after the move, {sh.next_id - first} heartbeat(s) sent on the stalled stream "
                        f"that answers nothing; want 2 (each forgotten a TTL after its send, the next sent)")
        self.assertTrue(s.valid(), f"session lost: {s._err}")


if __name__ == "__main__":
    unittest.main()
