"""What lockd.aio's threads used to hide, now that it runs on grpc.aio:
a waiting acquire cancelled by task cancellation (even twice) leaves
nothing behind — its queue place is left and a grant that raced the
cancellation is released when the next heartbeat answer lists it — and the
keepalive task ends with the client's last session (no task left pending).
The fake-server tests run under a fake clock; each has a control that
breaks its rule on purpose and must fail. The last test runs against real
lockd (test/sdk TestPythonSDK)."""

import asyncio
import unittest
from unittest import mock

import lockd
import lockd.aio
from lockd import _aiokeepalive, _aiosession

from . import integration as it
from .test_aio_timing import WAIT, apoll, run, start


def others():
    """The SDK's tasks left on the loop (every task lockd.aio starts is named lockd-...)."""
    return {t for t in asyncio.all_tasks() if t.get_name().startswith("lockd")}


class Checks:
    async def cancelled_wait_leaves_nothing(self):
        c, clock, srv, fk = start(ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        async with c:
            s = await c.session()
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 1))
            fk.block["Acquire"] = asyncio.Event()  # the wait never ends by itself
            fk.grant_on_cancel.add("Acquire")      # the server grants as the cancellation comes
            task = asyncio.ensure_future(s.acquire("k"))
            self.assertTrue(await apoll(lambda: "Acquire" in fk.names()))
            task.cancel()
            for _ in range(3):
                await asyncio.sleep(0)
            task.cancel()  # and again
            with self.assertRaises(asyncio.CancelledError):
                await task
            self.assertIn("k", srv.held[s.id], "the fake did not grant the key (test setup)")
            self.assertTrue(await apoll(lambda: "LeaveQueue" in fk.names(), timeout=WAIT),
                            "the cancelled wait did not leave the queue")
            before = srv.heartbeats
            clock.advance(2.0)  # the next heartbeat: its held set lists k, which no lock knows
            self.assertTrue(await apoll(lambda: srv.heartbeats > before, timeout=WAIT))
            self.assertTrue(await apoll(lambda: not srv.held[s.id], timeout=WAIT),
                            "the grant that raced the cancellation is still held")
            self.assertEqual(s.locks, {})
            self.assertTrue(s.valid())
            await s.close()
            self.assertEqual(others(), set(), "a task is left after the session's close")

    async def keepalive_ends_with_last_session(self):
        c, clock, srv, fk = start(ttl=60.0, remaining=10.0, margin=0.5, interval=2.0)
        async with c:
            s1 = await c.session()
            s2 = await c.session()
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 2))
            ka = c.ka._task
            self.assertIsNotNone(ka)
            await s1.close()
            self.assertFalse(ka.done(), "the keepalive task ended while a session is left")
            await s2.close()
            self.assertTrue(ka.done(), "the keepalive task still runs after the last session's close")
            self.assertEqual(others(), set(), "a task is left after the last session's close")
            s3 = await c.session()  # a new session starts the keepalive again
            self.assertTrue(await apoll(lambda: srv.heartbeats >= 3))
            self.assertFalse(s3.lost.is_set())
        self.assertEqual(others(), set(), "a task is left after the client's close")


class AioCancelTest(unittest.TestCase, Checks):
    def test_cancelled_wait_leaves_nothing(self):
        run(self.cancelled_wait_leaves_nothing())

    def test_keepalive_ends_with_last_session(self):
        run(self.keepalive_ends_with_last_session())


class AioCancelControlTest(unittest.TestCase, Checks):
    """Each rule broken on purpose: its check must fail."""

    def caught(self, what, coro):
        with self.assertRaises(AssertionError) as cm:
            run(coro)
        print(f"\naio control ({what}) caught: {str(cm.exception).splitlines()[0]}")

    def test_control_unclaimed_grant_kept(self):
        with mock.patch.object(_aiosession.Session, "_release_orphan", lambda self, key, token: None):
            self.caught("unclaimed grants not released", self.cancelled_wait_leaves_nothing())

    def test_control_close_does_not_wait(self):
        async def no_settle(self):
            pass
        with mock.patch.object(_aiokeepalive.Keepaliver, "settle", no_settle):
            self.caught("close does not wait for the keepalive task", self.keepalive_ends_with_last_session())


@it.need("PYSDK_BACKENDS")
class AioCancelRealTest(unittest.TestCase):
    def test_cancelled_wait_real(self):
        """Against real lockd: a waiting acquire cancelled by its task leaves
        the queue, the key is free once its holder releases it, and the
        client's close leaves no task."""
        async def body(b):
            key = f"aiocancel/{b}"
            async with lockd.aio.Client(it.addr(b), backoff=(0.01, 0.2)) as c:
                async with await c.session() as s, await c.session() as s2:
                    lock = await s.acquire(key, timeout=10)
                    task = asyncio.ensure_future(s2.acquire(key))
                    while (await c.inspect(key)).waiters != [s2.id]:
                        await asyncio.sleep(0.01)
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    await lock.release()
                    loop = asyncio.get_running_loop()
                    end = loop.time() + 2 * it.HEARTBEAT_WAIT
                    while loop.time() < end:
                        info = await c.inspect(key)
                        if not info.held and not info.waiters:
                            break
                        await asyncio.sleep(0.02)
                    self.assertFalse(info.held or info.waiters, f"{key} not free after the cancelled wait: {info}")
                    self.assertEqual(s2.locks, {})
            self.assertEqual(others(), set(), "a task is left after the client's close")
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                asyncio.run(asyncio.wait_for(body(b), 60))


if __name__ == "__main__":
    unittest.main()
