"""The asyncio API against real lockd (test/sdk TestPythonSDK)."""

import asyncio
import unittest

import lockd
import lockd.aio

from . import integration as it


@it.need("PYSDK_BACKENDS")
class AioTest(unittest.TestCase):
    def test_aio(self):
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                asyncio.run(asyncio.wait_for(self.run_aio(b), 120))

    async def run_aio(self, b):
        async with lockd.aio.Client(it.addr(b), backoff=(0.01, 0.2)) as c:
            w = await c.watch("aio/")
            async with await c.session(owner="aio") as s, await c.session() as s2:
                async with await s.acquire("aio/k", timeout=10) as lock:
                    self.assertTrue(lock.valid())
                    self.assertEqual((await c.inspect("aio/k")).token, lock.token)
                    ev = await w.__anext__()
                    self.assertEqual((ev.kind, ev.key, ev.token), (lockd.EventKind.ACQUIRED, "aio/k", lock.token))
                    # A waiting acquire whose task is cancelled leaves the queue.
                    task = asyncio.ensure_future(s2.acquire("aio/k"))
                    while (await c.inspect("aio/k")).waiters != [s2.id]:
                        await asyncio.sleep(0.01)
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    while (await c.inspect("aio/k")).waiters:
                        await asyncio.sleep(0.01)
                    with self.assertRaises(lockd.Locked):
                        await s2.try_acquire("aio/k")
                # Revoke: lost is an asyncio.Event set from the SDK's thread.
                other = await s.acquire("aio/rv")
                await c.revoke("aio/rv")
                await asyncio.wait_for(other.lost.wait(), it.HEARTBEAT_WAIT)
                self.assertIsInstance(other.error, lockd.LockLost)
                lead = await s2.campaign("aio/el", b"v")
                obs = await c.observe("aio/el")
                o = await obs.__anext__()
                while o.value != b"v":
                    o = await obs.__anext__()
                self.assertEqual((o.session, o.token), (s2.id, lead.token))
                await obs.aclose()
                await lead.resign()
            await w.aclose()


if __name__ == "__main__":
    unittest.main()
