"""lockd.aio's waiting calls cancelled twice (no server: a fake sync
session whose wait is granted after the first cancellation, as a grant that
raced it). The grant must be released whatever further cancellations come;
before, a second cancellation while the first was being handled cancelled
that handling and the grant stayed held until the session ended. Nothing
here sleeps to order events: threading.Events and loop yields do."""

import asyncio
import threading
import unittest

import lockd.aio


class FakeLock:
    def __init__(self, key):
        self.key = key
        self.released = threading.Event()

    def release(self, timeout=-1.0):
        self.released.set()

    def on_lost(self, fn):
        pass


class FakeSession:
    """A sync session whose waits block until granted, ignoring cancel."""

    def __init__(self):
        self.entered = threading.Event()
        self.grant = threading.Event()
        self.returned = threading.Event()
        self.locks = []

    def on_lost(self, fn):
        pass

    def _wait(self, keys):
        self.entered.set()
        self.grant.wait(30)
        self.locks = [FakeLock(k) for k in keys]
        self.returned.set()
        return self.locks

    def acquire(self, key, timeout=None, cancel=None, **kw):
        return self._wait([key])[0]

    def acquire_all(self, keys, timeout=None, cancel=None, no_deadlock_check=False):
        return self._wait(keys)


class AioCancelTwiceTest(unittest.TestCase):
    def test_acquire_cancelled_twice_releases(self):
        asyncio.run(self.cancel_twice(lambda s: s.acquire("k"), 1))

    def test_acquire_all_cancelled_twice_releases(self):
        asyncio.run(self.cancel_twice(lambda s: s.acquire_all(["a", "b", "c"]), 3))

    async def cancel_twice(self, call, n):
        fake = FakeSession()
        s = lockd.aio.Session(fake)
        task = asyncio.ensure_future(call(s))
        await asyncio.get_running_loop().run_in_executor(None, fake.entered.wait, 30)
        task.cancel()
        for _ in range(5):  # the task handles its cancellation: it waits for the call to end
            await asyncio.sleep(0)
        self.assertFalse(task.done())
        task.cancel()  # again, while the first is handled
        for _ in range(5):
            await asyncio.sleep(0)
        fake.grant.set()  # the grant that raced the cancellations
        with self.assertRaises(asyncio.CancelledError):
            await task
        # The task ends only after the call returned and its grants were released.
        self.assertTrue(fake.returned.is_set(), "the cancelled task ended before the call it cancelled returned")
        self.assertEqual(len(fake.locks), n)
        for l in fake.locks:
            self.assertTrue(l.released.is_set(), f"{l.key}: the grant that raced the cancellations was not released")


if __name__ == "__main__":
    unittest.main()
