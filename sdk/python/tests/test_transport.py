"""TLS/mTLS, bearer tokens and several addresses with failover and drain,
against real lockd servers (test/sdk TestPythonSDK)."""

import os
import queue
import threading
import unittest

import lockd

from . import integration as it
from .util import poll


@it.need("PYSDK_TLS_ADDR")
class TLSTest(unittest.TestCase):
    def test_mtls(self):
        env = os.environ
        tls = lockd.TLS(env["PYSDK_TLS_CA"], env["PYSDK_TLS_CERT"], env["PYSDK_TLS_KEY"])
        with lockd.Client(env["PYSDK_TLS_ADDR"], tls=tls) as c, c.session() as s:
            with s.acquire("tls/k", timeout=10) as lock:
                self.assertTrue(lock.valid())
        # Without a client certificate the server refuses the handshake;
        # plaintext to a TLS listener fails too.
        for name, kw in {"no client certificate": {"tls": lockd.TLS(env["PYSDK_TLS_CA"])},
                         "plaintext": {}}.items():
            with self.subTest(name), lockd.Client(env["PYSDK_TLS_ADDR"], call_timeout=1.0, **kw) as c:
                with self.assertRaises(lockd.Unavailable):
                    c.session()

    def test_tls_options_refused(self):
        with self.assertRaises(lockd.InvalidArgument):
            lockd.TLS("ca.pem", cert_file="c.pem")  # a certificate without its key
        with self.assertRaises(lockd.InvalidArgument):
            lockd.Client("10.1.2.3:7420", tls=lockd.TLS(), insecure=True)
        with self.assertRaises(lockd.InvalidArgument) as cm:
            lockd.Client("10.1.2.3:7420", insecure=True, token="secret-token-123")
        self.assertNotIn("secret-token-123", str(cm.exception))
        lockd.Client("10.1.2.3:7420", insecure=True).close()


@it.need("PYSDK_TOKEN_ADDR")
class TokenTest(unittest.TestCase):
    def test_bearer_token(self):
        addr, path = os.environ["PYSDK_TOKEN_ADDR"], os.environ["PYSDK_TOKEN_FILE"]
        with lockd.Client(addr, token_file=path) as c, c.session() as s:
            s.acquire("tok/k").release()
        with open(path) as f:
            token = f.read().strip()
        with lockd.Client(addr, token=token) as c:
            c.inspect("tok/k")
        unknown = "not-a-known-token-9876543210"
        with lockd.Client(addr, token=unknown) as c:
            with self.assertRaises(lockd.Unauthenticated) as cm:
                c.session()
            self.assertNotIn(unknown, str(cm.exception))
            self.assertNotIn(unknown, repr(c.conn))
        with lockd.Client(addr) as c:
            with self.assertRaises(lockd.PermissionDenied) as cm:
                c.inspect("tok/k")
            self.assertEqual(cm.exception.reason, "ACCESS_DENIED")

    def test_close_sessions(self):
        """An admin closes every session of a principal (C2
        #ct2-close-sessions): the locks are free at once, each session learns
        it by its next heartbeat answer; a caller without admin is refused."""
        addr, path = os.environ["PYSDK_TOKEN_ADDR"], os.environ["PYSDK_TOKEN_FILE"]
        with lockd.Client(addr, token_file=path) as c:
            s1, s2 = c.session(), c.session()
            s1.acquire("closes/a")
            s2.acquire("closes/b")
            with lockd.Client(addr, token_file=path) as admin:
                closed, released = admin.close_sessions("alice")
            self.assertGreaterEqual(closed, 2)
            self.assertGreaterEqual(released, 2)
            for key in ("closes/a", "closes/b"):
                self.assertFalse(c.inspect(key).held, key)
            for s in (s1, s2):
                self.assertTrue(s.lost.wait(it.HEARTBEAT_WAIT + it.TTL), "a closed session never learnt it")
                self.assertFalse(s.valid())
        with lockd.Client(addr) as anon:
            with self.assertRaises(lockd.PermissionDenied) as cm:
                anon.close_sessions("alice")
            self.assertEqual(cm.exception.reason, "ACCESS_DENIED")


class _Reader:
    """Reads a watch on a thread of the test's into a queue, so that the test
    waits for events with a bound."""

    def __init__(self, w):
        self.w, self.q = w, queue.Queue()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        try:
            for ev in self.w:
                self.q.put(ev)
        except lockd.LockdError as e:
            self.q.put(e)

    def take(self, timeout=30.0):
        ev = self.q.get(timeout=timeout)
        if isinstance(ev, Exception):
            raise ev
        return ev

    def close(self):
        self.w.close()
        self.t.join()


@it.need("PYSDK_BACKENDS", "PYSDK_CONTROL")
class FailoverTest(unittest.TestCase):
    def test_failover_drain_and_kill(self):
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                self.failover(b)

    def next_kind(self, r, action, i):
        try:
            ev = r.take()
        except queue.Empty:
            self.fail(f"{action} replica {i}: no watch event")
        return (str(ev.kind), ev.key)

    def failover(self, b):
        c = lockd.Client(it.replicas(b), backoff=(0.01, 0.2))
        self.addCleanup(c.close)
        s = c.session()
        lock = s.acquire("fo/held")
        losses = []
        lock.on_lost(losses.append)
        r = _Reader(c.watch("fo/ev/"))
        self.addCleanup(r.close)
        for step, (i, action) in enumerate([(0, "stop"), (1, "kill")]):
            it.control(b, i, action)
            # The next answers come from another replica: the lock is kept
            # and its trust renewed there.
            after = c.clock.now()
            self.assertTrue(poll(lambda: lock.deadline > after + it.TTL / 2, timeout=3 * it.TTL),
                            f"{action} replica {i}: lock not renewed by another replica")
            self.assertEqual(losses, [], f"{action} replica {i}: lock lost")
            self.assertTrue(lock.valid() and s.valid())
            # The watch resumes on another replica. PostgreSQL keeps no
            # history: the resumed stream says RESYNC first (events between
            # the break and the resume are not replayed), so the events
            # below are made after it. etcd replays from the cursor: every
            # event comes exactly once, whenever the stream resumes.
            if b == "pg":
                self.assertEqual(self.next_kind(r, action, i), ("resync", ""))
            key = f"fo/ev/{step}"
            s.acquire(key).release()
            kinds = [self.next_kind(r, action, i), self.next_kind(r, action, i)]
            self.assertEqual(kinds, [("acquired", key), ("released", key)])
        lock.release()


if __name__ == "__main__":
    unittest.main()
