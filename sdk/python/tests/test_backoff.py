"""Reconnect backoff (docs/contracts/C2.md #ct2-sdk rule 11) under a fake
clock: the KeepAlive stream is dialled again on the Go SDK's schedule
(client.DefaultBackoffMin/Max, client.(*Client).backoff, keepaliver.run) —
wait d/2 + uniform(0, d/2) with d = min(min * 2**attempt, max), the first
reconnect after a stream that carried an answer at once. Nothing here sleeps
to order events: the clock moves only when the test advances it."""

import inspect
import pathlib
import random
import re
import types
import unittest
from unittest import mock

import lockd
from lockd import client as client_mod

from .fake import FakeServer
from .util import poll

GO_OPTIONS = pathlib.Path(__file__).resolve().parents[3] / "client" / "options.go"
MIN, MAX = 0.05, 2.0  # the defaults, checked against the Go SDK's below


def nominal(attempt: int) -> float:
    return min(MIN * 2 ** min(attempt, 16), MAX)


class BackoffTest(unittest.TestCase):
    def test_defaults_are_the_go_sdks(self):
        src = GO_OPTIONS.read_text()
        lo = re.search(r"DefaultBackoffMin\s*=\s*(\d+)\s*\*\s*time\.Millisecond", src)
        hi = re.search(r"DefaultBackoffMax\s*=\s*(\d+)\s*\*\s*time\.Second", src)
        self.assertTrue(lo and hi, f"DefaultBackoffMin/Max not found in {GO_OPTIONS}")
        self.assertEqual((int(lo[1]) / 1000, float(hi[1])), (MIN, MAX))
        self.assertEqual(inspect.signature(lockd.Client.__init__).parameters["backoff"].default, (MIN, MAX))

    def test_jitter_bounds(self):
        # Every wait lies in [d/2, d] and the jitter spreads over that range.
        c = types.SimpleNamespace(backoff_min=MIN, backoff_max=MAX)
        with mock.patch.object(client_mod, "random", random.Random(25)):
            for attempt in range(20):
                d = nominal(attempt)
                w = [lockd.Client._backoff(c, attempt) for _ in range(200)]
                self.assertTrue(all(d / 2 <= x <= d for x in w), f"attempt {attempt}: {min(w)}..{max(w)} not in "
                                                                 f"[{d / 2}, {d}]")
                self.assertLess(min(w), 0.55 * d, f"attempt {attempt}: no jitter near d/2")
                self.assertGreater(max(w), 0.95 * d, f"attempt {attempt}: no jitter near d")

    def test_reconnect_schedule(self):
        for name, pick in (("shortest", lambda a, b: a), ("longest", lambda a, b: b)):
            with self.subTest(jitter=name):
                self.schedule(pick)

    def schedule(self, pick):
        clock = lockd.FakeClock()
        srv = FakeServer(clock, remaining=100.0)
        srv.down = True
        with mock.patch.object(client_mod, "random", types.SimpleNamespace(uniform=pick)):
            c = lockd.Client("127.0.0.1:1", clock=clock, _stub_factory=srv.stub)  # the default backoff
            try:
                c.session()
                # The server is down from the start: each failed dial waits
                # backoff(attempt), doubling from 50 ms to the 2 s cap.
                for attempt in range(9):
                    self.redial(clock, srv, attempt + 1, nominal(attempt) / 2 + pick(0, nominal(attempt) / 2))
                # Back up: the stream carries an answer, then breaks. The
                # first reconnect goes at once, the next ones back off again.
                srv.down = False
                n = len(srv.dials)
                self.redial(clock, srv, n, nominal(8) / 2 + pick(0, nominal(8) / 2))
                self.assertTrue(poll(lambda: srv.heartbeats >= 1), "no heartbeat on the restored stream")
                srv.down = True
                srv.streams[-1].cancel()
                t = clock.now()
                self.assertTrue(poll(lambda: len(srv.dials) == n + 2), "no reconnect after a healthy stream broke")
                self.assertEqual(srv.dials[-1], t, "the first reconnect after a healthy stream must go at once")
                for attempt in (1, 2, 3):
                    self.redial(clock, srv, n + 1 + attempt, nominal(attempt) / 2 + pick(0, nominal(attempt) / 2))
            finally:
                c.close()

    def redial(self, clock, srv, n, wait):
        """Dial n happened now; the next one is due exactly wait later and not before."""
        t = clock.now()
        self.assertTrue(poll(lambda: len(srv.dials) >= n), f"dial {n} never happened")
        self.assertTrue(poll(lambda: clock.pending(t + wait - 1e-9, t + wait + 1e-9)),
                        f"after dial {n}: no re-dial due {wait:.3f}s later")
        self.assertEqual(len(srv.dials), n, f"after dial {n}: re-dialled without waiting {wait:.3f}s")
        clock.advance(wait)
        self.assertTrue(poll(lambda: len(srv.dials) == n + 1), f"dial {n + 1} not made {wait:.3f}s after dial {n}")
        self.assertAlmostEqual(srv.dials[n], t + wait, msg=f"dial {n + 1} at the wrong time")
