"""acquire(..., on_wait_update=fn) against real lockd on both backends, sync
and lockd.aio (test/sdk TestPythonSDK; C2 #ct2-wait-updates, issue 27)."""

import asyncio
import collections
import os
import threading
import unittest

import lockd
import lockd.aio

from . import integration as it
from .util import poll


def count_inspects(c):
    """Counts the Inspect calls client c sends, per key (a spy on the SDK's
    own call path; the server is real)."""
    calls = collections.Counter()
    orig = c._call

    def spy(method, req, **kw):
        if method == "Inspect":
            calls[req.key] += 1
        return orig(method, req, **kw)
    c._call = spy
    return calls


class Collect:
    """One acquire's updates; any that comes after the acquire returned is late."""

    def __init__(self):
        self.got, self.late, self.threads = [], [], set()
        self.returned = threading.Event()

    def __call__(self, u):
        if self.returned.is_set():
            self.late.append(u)
        self.threads.add(threading.current_thread().name)
        self.got.append(u)

    def first(self, want_estimate):
        return next((u for u in list(self.got) if u.error is None and u.position == 1 and u.waiters == 1
                     and (u.estimate is not None or not want_estimate)), None)


@it.need("PYSDK_BACKENDS")
class WaitUpdatesTest(unittest.TestCase):
    def test_wait_updates(self):
        """A second waiter behind a holder gets an update with position 1 of
        1 (no estimate before holds of the key ended, one after); none comes
        after its acquire returned; an acquire without the option, waiting
        beside it, sends no Inspect."""
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                c = lockd.Client(it.addr(b), backoff=(0.01, 0.2))
                self.addCleanup(c.close)
                look = lockd.Client(it.addr(b), backoff=(0.01, 0.2))  # the test's own reads, not counted
                self.addCleanup(look.close)
                calls = count_inspects(c)
                pre = f"pywu{b}{os.getpid()}"  # a first segment of its own: a template with no history
                key, plain = pre + "/k", pre + "/plain"
                with c.session() as h, c.session() as w, c.session() as p:
                    with self.assertRaises(lockd.InvalidArgument):
                        w.acquire(key, timeout=1, on_wait_update=print, wait_update_every=0.05)
                    for want_estimate in (False, True):
                        l, pl = h.acquire(key, timeout=10), h.acquire(plain, timeout=10)
                        u, results = Collect(), []

                        def wait(s, k, **kw):
                            try:
                                s.acquire(k, timeout=30, **kw).release()
                                results.append("ok")
                            except lockd.LockdError as e:
                                results.append(e)
                            finally:
                                if kw:
                                    u.returned.set()
                        base = calls[key]
                        ts = [threading.Thread(target=wait, args=(w, key), kwargs=dict(on_wait_update=u,
                                                                                          wait_update_every=0.1)),
                              threading.Thread(target=wait, args=(p, plain))]
                        for t in ts:
                            t.start()
                        self.assertTrue(poll(lambda: u.first(want_estimate) is not None, timeout=30), u.got)
                        first = u.first(want_estimate)
                        self.assertEqual((first.key, first.info.held, first.info.token, first.info.session),
                                         (key, True, l.token, h.id))
                        if want_estimate:
                            self.assertGreaterEqual(first.estimate, 0.0)
                        else:
                            self.assertIsNone(first.estimate)
                        # The plain acquire, queued, waited beside the other for
                        # more than the first read's delay (4 reads of key).
                        self.assertTrue(poll(lambda: look.inspect(plain).waiters == [p.id] and calls[key] >= base + 4,
                                             timeout=30))
                        self.assertEqual(calls[plain], 0, "an acquire without on_wait_update sent Inspect")
                        l.release()
                        pl.release()
                        for t in ts:
                            t.join(30)
                        self.assertEqual(results, ["ok", "ok"])
                        self.assertEqual(u.late, [])
                        self.assertEqual(u.threads, {"lockd-wait-updates"})
                    self.assertEqual(calls[plain], 0)

    def test_aio_wait_updates(self):
        """lockd.aio: the updates come on the event loop, position 1 of 1,
        none after the acquire returned; a coroutine function is refused."""
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                asyncio.run(asyncio.wait_for(self.run_aio(b), 120))

    async def run_aio(self, b):
        key = f"pywuaio{b}{os.getpid()}/k"
        async with lockd.aio.Client(it.addr(b), backoff=(0.01, 0.2)) as c:
            async with await c.session() as h, await c.session() as w:
                async def coro(u):
                    pass
                with self.assertRaises(lockd.InvalidArgument):
                    await w.acquire(key, timeout=1, on_wait_update=coro)
                lock = await h.acquire(key, timeout=10)
                u = Collect()
                loop_thread = threading.current_thread().name
                task = asyncio.ensure_future(w.acquire(key, timeout=30, on_wait_update=u, wait_update_every=0.1))
                while u.first(False) is None:
                    await asyncio.sleep(0.01)
                await lock.release()
                got = await task
                u.returned.set()
                n = len(u.got)
                await got.release()
                # Give anything scheduled a chance to run: none may come.
                for _ in range(10):
                    await asyncio.sleep(0)
                self.assertEqual((len(u.got), u.late), (n, []))
                self.assertEqual(u.threads, {loop_thread})


@it.need("PYSDK_TOKEN_ADDR", "PYSDK_LOCKER_TOKEN_FILE")
class WaitUpdatesDeniedTest(unittest.TestCase):
    def test_denied(self):
        """A caller who may lock a key but not read it (locker, under
        lockonly/) gets one update, PermissionDenied with no figures, sends
        no Inspect after it while a reading control waiter (alice) reads 4
        more times, and its acquire is granted."""
        addr = os.environ["PYSDK_TOKEN_ADDR"]
        alice = lockd.Client(addr, token_file=os.environ["PYSDK_TOKEN_FILE"], backoff=(0.01, 0.2))
        self.addCleanup(alice.close)
        locker = lockd.Client(addr, token_file=os.environ["PYSDK_LOCKER_TOKEN_FILE"], backoff=(0.01, 0.2))
        self.addCleanup(locker.close)
        calls, alice_calls = count_inspects(locker), count_inspects(alice)
        key, control = f"lockonly/{os.getpid()}/k", f"lockonly/{os.getpid()}/control"
        with alice.session() as h, alice.session() as cw, locker.session() as w:
            l, cl = h.acquire(key, timeout=10), h.acquire(control, timeout=10)
            u, cu, results = Collect(), Collect(), []

            def wait(s, k, fn):
                try:
                    s.acquire(k, timeout=30, on_wait_update=fn, wait_update_every=0.1).release()
                    results.append("ok")
                except lockd.LockdError as e:
                    results.append(e)
            ts = [threading.Thread(target=wait, args=(w, key, u)), threading.Thread(target=wait, args=(cw, control, cu))]
            for t in ts:
                t.start()
            self.assertTrue(poll(lambda: len(u.got) > 0, timeout=30))
            first = u.got[0]
            self.assertIsInstance(first.error, lockd.PermissionDenied)
            self.assertEqual((first.position, first.waiters, first.estimate, first.info), (0, 0, None, None))
            base = alice_calls[control]
            self.assertTrue(poll(lambda: alice.inspect(key).waiters == [w.id] and alice_calls[control] >= base + 4,
                                 timeout=30))
            self.assertEqual((len(u.got), calls[key]), (1, 1), "no read after the refusal")
            self.assertIsNotNone(cu.first(False), "the control waiter got no update with position 1")
            l.release()
            cl.release()
            for t in ts:
                t.join(30)
            self.assertEqual(results, ["ok", "ok"])


if __name__ == "__main__":
    unittest.main()
