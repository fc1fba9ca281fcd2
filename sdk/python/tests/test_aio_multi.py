"""lockd.aio's semaphores, read/write locks and election against real lockd
on both backends (test/sdk TestPythonSDK): the sync SDK's requests through
the asyncio calls."""

import asyncio
import unittest

import lockd
import lockd.aio

from . import integration as it


@it.need("PYSDK_BACKENDS")
class AioMultiTest(unittest.TestCase):
    def test_semaphore_rw_election(self):
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                asyncio.run(asyncio.wait_for(self.body(b), 120))

    async def body(self, b):
        async with lockd.aio.Client(it.addr(b), backoff=(0.01, 0.2)) as c:
            async with await c.session() as s1, await c.session() as s2, await c.session() as s3:
                # A semaphore of 2: two slots, the third is refused, a limit mismatch too.
                l1 = await s1.acquire("asem/k", limit=2)
                l2 = await s2.acquire("asem/k", limit=2)
                self.assertNotEqual(l1.token, l2.token)
                with self.assertRaises(lockd.Locked):
                    await s3.try_acquire("asem/k", limit=2)
                with self.assertRaises(lockd.LimitMismatch):
                    await s3.try_acquire("asem/k", limit=3)
                waiter = asyncio.ensure_future(s3.acquire("asem/k", limit=2, timeout=10))
                while (await c.inspect("asem/k")).waiters != [s3.id]:
                    await asyncio.sleep(0.01)
                await l1.release()
                l3 = await waiter
                self.assertTrue(l3.valid())
                await l2.release()
                await l3.release()
                # Read/write: two readers share, a writer waits for both.
                r1 = await s1.acquire("arw/k", shared=True)
                r2 = await s2.acquire("arw/k", shared=True)
                with self.assertRaises(lockd.Locked):
                    await s3.try_acquire("arw/k", exclusive=True)
                w = asyncio.ensure_future(s3.acquire("arw/k", exclusive=True, timeout=10))
                while (await c.inspect("arw/k")).waiters != [s3.id]:
                    await asyncio.sleep(0.01)
                await r1.release()
                self.assertFalse(w.done())
                await r2.release()
                async with await w as wl:
                    self.assertTrue(wl.valid())
                    info = await c.inspect("arw/k")
                    self.assertEqual([h.mode for h in info.holders], ["exclusive"])
                # Election: the leader proclaims, the next candidate leads after it resigns.
                async with await s1.campaign("ael/e", b"one") as lead:
                    await lead.proclaim(b"two")
                    self.assertEqual((await c.inspect("ael/e")).value, b"two")
                    nxt = asyncio.ensure_future(s2.campaign("ael/e", b"next", timeout=10))
                    while (await c.inspect("ael/e")).waiters != [s2.id]:
                        await asyncio.sleep(0.01)
                lead2 = await nxt
                self.assertGreater(lead2.token, lead.token)
                self.assertTrue(lead.lost.is_set() and not lead.valid())
                await lead2.resign()


if __name__ == "__main__":
    unittest.main()
