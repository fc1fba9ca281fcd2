"""Several locks at once (docs/contracts/C2.md #ct2-acquire-all) against real
lockd servers on etcd and PostgreSQL (test/sdk TestPythonSDK): grants in the
order asked, all or none, and a wait that closes a cycle raising Deadlock."""

import asyncio
import threading
import unittest

import lockd
import lockd.aio

from . import integration as it
from .util import poll


@it.need("PYSDK_BACKENDS")
class AcquireAllTest(unittest.TestCase):
    def each(self, fn):
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                c = lockd.Client(it.addr(b), backoff=(0.01, 0.2))
                self.addCleanup(c.close)
                fn(b, c)

    def test_acquire_all(self):
        """Every key granted with its own token, in the order asked; a try
        with one key held raises Locked and takes none; a wait that times
        out leaves nothing; bad keys are refused before anything is sent."""
        def run(b, c):
            with c.session() as s1, c.session() as s2:
                locks = s1.acquire_all(["aa/c", "aa/a"], timeout=10)
                self.assertEqual([l.key for l in locks], ["aa/c", "aa/a"])
                for l in locks:
                    self.assertTrue(l.valid())
                    self.assertEqual(c.inspect(l.key).token, l.token)
                with self.assertRaises(lockd.Locked):
                    s2.try_acquire_all(["aa/0", "aa/a"])
                self.assertFalse(c.inspect("aa/0").held, b)
                with self.assertRaises(lockd.WaitTimeout):
                    s2.acquire_all(["aa/0", "aa/a"], timeout=0.3)
                info = c.inspect("aa/0")
                self.assertFalse(info.held, (b, info))
                for bad in ([], ["aa/x", "aa/x"], "aa/x", [""]):
                    with self.assertRaises(lockd.InvalidArgument, msg=repr(bad)):
                        s2.acquire_all(bad)
                for l in locks:
                    l.release()
                got = s2.try_acquire_all(["aa/0", "aa/a"])
                self.assertGreater(got[1].token, locks[1].token)
                for l in got:
                    l.release()
        self.each(run)

    def test_acquire_all_deadlock(self):
        """A holds d/b and waits for d/a; B holds d/a and asks for d/0 and
        d/b at once: B takes d/0, waits for d/b and closes the cycle, so it
        raises lockd.Deadlock naming d/a and d/b and holds none of its keys
        (d/0 given back); A is granted once B releases d/a."""
        def run(b, c):
            ka, kb, k0 = "aad/a", "aad/b", "aad/0"
            with c.session() as sa, c.session() as sb:
                sa.acquire(kb, timeout=10)
                la = sb.acquire(ka, timeout=10)
                got = {}

                def wait():
                    try:
                        got["a"] = sa.acquire(ka, timeout=30)
                    except lockd.LockdError as e:
                        got["a"] = e
                t = threading.Thread(target=wait)
                t.start()
                self.assertTrue(poll(lambda: len(c.inspect(ka).waiters) == 1, timeout=10))
                with self.assertRaises(lockd.Deadlock) as cm:
                    sb.acquire_all([kb, k0], timeout=30)
                self.assertEqual(cm.exception.keys, [ka, kb])
                self.assertFalse(c.inspect(k0).held, b)
                self.assertNotIn("a", got)
                la.release()
                t.join(30)
                self.assertIsInstance(got.get("a"), lockd.Lock, (b, got))
        self.each(run)

    def test_acquire_all_deadlock_opt_out(self):
        """As test_acquire_all_deadlock, but B's acquire_all opts out
        (no_deadlock_check): A's older wait is refused instead, and B is
        granted both keys once A releases d/b (the server dropped the option
        beside keys before 2026-12-06 and refused B)."""
        def run(b, c):
            ka, kb, k0 = "aado/a", "aado/b", "aado/0"
            with c.session() as sa, c.session() as sb:
                lb = sa.acquire(kb, timeout=10)
                la = sb.acquire(ka, timeout=10)
                got = {}

                def wait():
                    try:
                        got["a"] = sa.acquire(ka, timeout=30)
                    except lockd.LockdError as e:
                        got["a"] = e
                t = threading.Thread(target=wait)
                t.start()
                self.assertTrue(poll(lambda: len(c.inspect(ka).waiters) == 1, timeout=10))

                def wait_all():
                    try:
                        got["b"] = sb.acquire_all([kb, k0], timeout=30, no_deadlock_check=True)
                    except lockd.LockdError as e:
                        got["b"] = e
                tb = threading.Thread(target=wait_all)
                tb.start()
                t.join(30)
                self.assertIsInstance(got.get("a"), lockd.Deadlock, (b, got))
                self.assertNotIn("b", got)
                lb.release()
                tb.join(30)
                self.assertIsInstance(got.get("b"), list, (b, got))
                for l in got["b"] + [la]:
                    l.release()
        self.each(run)

    def test_aio_acquire_all(self):
        async def run(b):
            async with lockd.aio.Client(it.addr(b), backoff=(0.01, 0.2)) as c:
                async with await c.session() as s, await c.session() as s2:
                    locks = await s.acquire_all(["aaio/b", "aaio/a"], timeout=10)
                    self.assertEqual([l.key for l in locks], ["aaio/b", "aaio/a"])
                    with self.assertRaises(lockd.Locked):
                        await s2.try_acquire_all(["aaio/0", "aaio/a"])
                    # A cancelled wait holds nothing, once the server has
                    # seen the cancellation (it frees aaio/0 after leaving
                    # aaio/a's queue).
                    task = asyncio.ensure_future(s2.acquire_all(["aaio/0", "aaio/a"]))
                    while not (await c.inspect("aaio/a")).waiters:
                        await asyncio.sleep(0.01)
                    self.assertEqual((await c.inspect("aaio/0")).session, s2.id)
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    while (await c.inspect("aaio/a")).waiters or (await c.inspect("aaio/0")).held:
                        await asyncio.sleep(0.01)
                    for l in locks:
                        await l.release()
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                asyncio.run(asyncio.wait_for(run(b), 60))


if __name__ == "__main__":
    unittest.main()
