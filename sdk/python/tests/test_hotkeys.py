"""Client.hot_keys and lockd.aio's, against real lockd on both backends
(test/sdk TestPythonSDK; C2 #ct2-hotkeys, issue 27)."""

import asyncio
import threading
import unittest

import lockd
import lockd.aio

from . import integration as it
from .util import poll


@it.need("PYSDK_BACKENDS")
class HotKeysTest(unittest.TestCase):
    def test_hot_keys(self):
        """A key held by one session and waited for by another ranks by
        wait, by hold and by contention (sync and aio); a key under another
        prefix is left out by the prefix (the control: it is listed without
        one); a limit over 50 is refused before any call."""
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                c = lockd.Client(it.addr(b), backoff=(0.01, 0.2))
                self.addCleanup(c.close)
                key, cold = f"pyhot/{b}/k", f"pycold/{b}/k"
                with c.session() as a, c.session() as w:
                    first = a.acquire(key, timeout=10)
                    a.acquire(cold, timeout=10).release()
                    got = {}

                    def wait():
                        try:
                            with w.acquire(key, timeout=30):
                                got["ok"] = True
                        except lockd.LockdError as e:
                            got["err"] = e
                    t = threading.Thread(target=wait)
                    t.start()
                    self.assertTrue(poll(lambda: c.inspect(key).waiters == [w.id], timeout=10))
                    first.release()
                    t.join(30)
                    self.assertEqual(got, {"ok": True})

                def ranked():
                    hk = c.hot_keys(f"pyhot/{b}/")
                    return (hk.enabled and hk.window == 60.0 and [h.key for h in hk.by_wait] == [key]
                            and hk.by_wait[0].score > 0 and [h.key for h in hk.by_hold] == [key]
                            and [h.key for h in hk.by_contention] == [key] and hk.by_contention[0].score >= 1)
                self.assertTrue(poll(ranked, timeout=10), c.hot_keys(f"pyhot/{b}/"))
                everything = {h.key for h in c.hot_keys(limit=50).by_wait}
                self.assertTrue({key, cold} <= everything, everything)
                with self.assertRaises(lockd.InvalidArgument) as cm:
                    c.hot_keys(limit=51)
                self.assertEqual(cm.exception.field, "limit")

                async def aio():
                    async with lockd.aio.Client(it.addr(b), backoff=(0.01, 0.2)) as ac:
                        return await ac.hot_keys(f"pyhot/{b}/", limit=1)
                hk = asyncio.run(asyncio.wait_for(aio(), 60))
                self.assertEqual([h.key for h in hk.by_hold], [key])
                self.assertIsInstance(hk.by_hold[0], lockd.HotKey)


if __name__ == "__main__":
    unittest.main()
