"""LockInfo.wait_estimates from Client.inspect, against real lockd on both
backends (test/sdk TestPythonSDK; C2 #ct2-wait-estimate, issue 27)."""

import os
import threading
import unittest

import lockd

from . import integration as it
from .util import poll


@it.need("PYSDK_BACKENDS")
class WaitEstimateTest(unittest.TestCase):
    def test_wait_estimate(self):
        """A waiter of a key (and template) with no hold observed has no
        estimate; once holds of the key ended, inspect gives the waiter one,
        position 1, not negative."""
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                c = lockd.Client(it.addr(b), backoff=(0.01, 0.2))
                self.addCleanup(c.close)
                key = f"pyeta{b}{os.getpid()}/k"  # a first segment of its own: a template with no history
                with c.session() as a, c.session() as w:
                    results = []

                    def wait():
                        try:
                            w.acquire(key, timeout=30).release()
                            results.append("ok")
                        except lockd.LockdError as e:
                            results.append(e)

                    def queued_behind(first):
                        t = threading.Thread(target=wait)
                        t.start()
                        self.assertTrue(poll(lambda: c.inspect(key).waiters == [w.id], timeout=10))
                        info = c.inspect(key)
                        first.release()
                        t.join(30)
                        return info

                    info = queued_behind(a.acquire(key, timeout=10))
                    self.assertEqual(info.wait_estimates, [])
                    # Holds of the key ended (a's and w's): now an estimate.
                    info = queued_behind(a.acquire(key, timeout=10))
                    self.assertEqual(len(info.wait_estimates), 1, info)
                    e = info.wait_estimates[0]
                    self.assertIsInstance(e, lockd.WaitEstimate)
                    self.assertEqual((e.session, e.position), (w.id, 1))
                    self.assertGreaterEqual(e.wait, 0.0)
                    self.assertEqual(results, ["ok", "ok"])


if __name__ == "__main__":
    unittest.main()
