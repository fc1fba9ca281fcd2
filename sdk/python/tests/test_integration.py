"""The SDK against real lockd servers on etcd and PostgreSQL (test/sdk
TestPythonSDK starts them): locks, fencing tokens, FIFO waits with timeout
and cancel, revoke, semaphores, shared locks, max hold, holder identity,
election, errors by reason."""

import threading
import unittest

import lockd

from . import integration as it
from .util import poll


def until(obs, pred, n=10):
    """The first of the next n observations that satisfies pred."""
    for _ in range(n):
        o = next(obs)
        if pred(o):
            return o
    raise AssertionError(f"no matching observation in {n}")


@it.need("PYSDK_BACKENDS")
class IntegrationTest(unittest.TestCase):
    def client(self, backend, **kw):
        c = lockd.Client(it.addr(backend), backoff=(0.01, 0.2), **kw)
        self.addCleanup(c.close)
        return c

    def each(self, fn):
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                fn(b, self.client(b))

    def test_deadlock(self):
        """C2 #ct2-deadlock: A holds a and waits for b, B holds b and waits
        for a; the closing wait raises lockd.Deadlock naming both keys (not
        retried), A is granted once B releases. With no_deadlock_check on
        B's wait, A's (older) wait is refused instead."""
        def run(b, c):
            for opt_out in (False, True):
                ka, kb = f"dl/{opt_out}/a", f"dl/{opt_out}/b"
                with c.session() as sa, c.session() as sb:
                    la, lb = sa.acquire(ka, timeout=10), sb.acquire(kb, timeout=10)
                    got = {}

                    def wait(name, s, key, **kw):
                        try:
                            got[name] = s.acquire(key, timeout=30, **kw)
                        except lockd.LockdError as e:
                            got[name] = e
                    ta = threading.Thread(target=wait, args=("a", sa, kb))
                    ta.start()
                    self.assertTrue(poll(lambda: len(c.inspect(kb).waiters) == 1, timeout=10))
                    tb = threading.Thread(target=wait, args=("b", sb, ka), kwargs={"no_deadlock_check": opt_out})
                    tb.start()
                    victim, other, give, keep = ("a", "b", la, lb) if opt_out else ("b", "a", lb, la)
                    self.assertTrue(poll(lambda: victim in got, timeout=10), (b, opt_out, got))
                    err = got[victim]
                    self.assertIsInstance(err, lockd.Deadlock, (b, opt_out))
                    self.assertEqual(err.keys, [ka, kb])
                    self.assertNotIn(other, got)
                    give.release()
                    (ta if other == "a" else tb).join(30)
                    (tb if other == "a" else ta).join(30)
                    self.assertIsInstance(got[other], lockd.Lock, (b, opt_out, got))
                    got[other].release()
                    keep.release()
        self.each(run)

    def test_check_token(self):
        """C2 #ct2-check-token: the holder's token is current in both modes,
        stale after the key passes to another session; a free key is not
        current; token 0 is refused before anything is sent."""
        def run(b, c):
            with c.session() as s1, c.session() as s2:
                l1 = s1.acquire("chk/k", timeout=10)
                for cached in (False, True):
                    got = c.check_token("chk/k", l1.token, cached=cached)
                    self.assertTrue(got.current, (b, cached, got))
                    self.assertEqual(got.tokens, [l1.token])
                l1.release()
                l2 = s2.acquire("chk/k", timeout=10)
                got = c.check_token("chk/k", l1.token)
                self.assertEqual((got.current, got.tokens, got.cached), (False, [l2.token], False))
                self.assertTrue(poll(lambda: not c.check_token("chk/k", l1.token, cached=True).current, timeout=10))
                self.assertFalse(c.check_token("chk/free", 7).current)
                with self.assertRaises(lockd.InvalidArgument):
                    c.check_token("chk/k", 0)
                l2.release()
        self.each(run)

    def test_lock_lifecycle(self):
        def run(b, c):
            with c.session(owner="py-worker (pid 1)", labels={"job": "t"}) as s:
                self.assertTrue(s.valid())
                with s.acquire("life/k", timeout=10, value=b"v1") as lock:
                    self.assertTrue(lock.valid())
                    self.assertGreater(lock.token, 0)
                    self.assertGreater(lock.deadline, c.clock.now())
                    info = c.inspect("life/k")
                    self.assertTrue(info.held)
                    self.assertEqual((info.session, info.token, info.owner, info.labels, info.value),
                                     (s.id, lock.token, "py-worker (pid 1)", {"job": "t"}, b"v1"))
                    lock.set_value(b"v2")
                    self.assertEqual(c.inspect("life/k").value, b"v2")
                    s2 = c.session()
                    with self.assertRaises(lockd.Locked) as cm:
                        s2.try_acquire("life/k")
                    self.assertIn("py-worker", str(cm.exception))
                    # Trust is renewed by heartbeats across several TTLs.
                    first = lock.deadline
                    self.assertTrue(poll(lambda: lock.deadline > first + it.TTL, timeout=3 * it.TTL))
                    self.assertTrue(lock.valid())
                    infos, _ = c.list("life/")
                    self.assertEqual([i.key for i in infos], ["life/k"])
                self.assertIsInstance(lock.error, lockd.Released)
                self.assertFalse(c.inspect("life/k").held)
                again = s.acquire("life/k")
                self.assertGreater(again.token, lock.token, "fencing tokens rise")
            self.assertTrue(s.lost.is_set())
            self.assertFalse(again.valid())
            self.assertTrue(poll(lambda: not c.inspect("life/k").held))
        self.each(run)

    def test_fifo_timeout_cancel(self):
        def run(b, c):
            holder, a, bb, cc = c.session(), c.session(), c.session(), c.session()
            lock = holder.acquire("fifo/k")
            with self.assertRaises(lockd.WaitTimeout):
                a.acquire("fifo/k", timeout=0.3)
            cancel = lockd.Cancel()
            errs = []
            t = threading.Thread(target=lambda: errs.append(self._catch(lambda: cc.acquire("fifo/k", cancel=cancel))))
            t.start()
            self.assertTrue(poll(lambda: len(c.inspect("fifo/k").waiters) == 1))
            cancel.cancel()
            t.join()
            self.assertIsInstance(errs[0], lockd.Cancelled)
            self.assertTrue(poll(lambda: c.inspect("fifo/k").waiters == []), "a cancelled waiter leaves the queue")
            # FIFO: a then bb queue; a gets it first.
            got = []
            ta = threading.Thread(target=lambda: got.append(("a", a.acquire("fifo/k", timeout=20))))
            ta.start()
            self.assertTrue(poll(lambda: c.inspect("fifo/k").waiters == [a.id]))
            tb = threading.Thread(target=lambda: got.append(("b", bb.acquire("fifo/k", timeout=20))))
            tb.start()
            self.assertTrue(poll(lambda: c.inspect("fifo/k").waiters == [a.id, bb.id]))
            lock.release()
            ta.join()
            self.assertEqual(got[0][0], "a")
            got[0][1].release()
            tb.join()
            self.assertEqual([g[0] for g in got], ["a", "b"])
            self.assertGreater(got[1][1].token, got[0][1].token)
        self.each(run)

    @staticmethod
    def _catch(fn):
        try:
            fn()
        except lockd.LockdError as e:
            return e
        return None

    def test_revoke_ends_trust(self):
        def run(b, c):
            s = c.session()
            lock = s.acquire("rv/k")
            kept = s.acquire("rv/kept")
            seen = []
            lock.on_lost(seen.append)
            rv = c.revoke("rv/k")
            self.assertEqual((rv.session, rv.token), (s.id, lock.token))
            self.assertTrue(lock.lost.wait(it.HEARTBEAT_WAIT), "revoked lock still trusted")
            self.assertIsInstance(lock.error, lockd.LockLost)
            self.assertEqual(seen, [lock.error])
            self.assertFalse(lock.valid())
            self.assertTrue(s.valid() and kept.valid())
            with self.assertRaises(lockd.NotOwner):
                lock.release()
        self.each(run)

    def test_semaphore_and_shared(self):
        def run(b, c):
            s1, s2, s3 = c.session(), c.session(), c.session()
            l1 = s1.acquire("sem/k", limit=2)
            l2 = s2.acquire("sem/k", limit=2)
            self.assertNotEqual(l1.token, l2.token)
            with self.assertRaises(lockd.Locked):
                s3.try_acquire("sem/k", limit=2)
            with self.assertRaises(lockd.LimitMismatch):
                s3.try_acquire("sem/k", limit=3)
            info = c.inspect("sem/k")
            self.assertEqual((info.limit, sorted(h.session for h in info.holders)), (2, sorted([s1.id, s2.id])))
            r1 = s1.acquire("rw/k", shared=True)
            r2 = s2.acquire("rw/k", shared=True)
            with self.assertRaises(lockd.Locked):
                s3.try_acquire("rw/k", exclusive=True)
            self.assertEqual({h.mode for h in c.inspect("rw/k").holders}, {"shared"})
            r1.release()
            r2.release()
            w = s3.acquire("rw/k", exclusive=True, timeout=10)
            self.assertGreater(w.token, max(r1.token, r2.token))
            with self.assertRaises(lockd.InvalidArgument):
                s3.acquire("rw/x", shared=True, limit=2)
        self.each(run)

    def test_max_hold(self):
        def run(b, c):
            s = c.session()
            lock = s.acquire("mh/k", max_hold=1.0)
            self.assertTrue(lock.lost.wait(1.0 + it.HEARTBEAT_WAIT + it.TTL), "max hold did not end the lock")
            self.assertIsInstance(lock.error, lockd.MaxHold)
            self.assertTrue(s.valid())
        self.each(run)

    def test_election(self):
        def run(b, c):
            obs = c.observe("el/leader")
            self.addCleanup(obs.close)
            self.assertFalse(next(obs).leader, "no leader yet")
            a, bb = c.session(owner="a"), c.session(owner="b")
            lead = a.campaign("el/leader", b"a-1")
            # The value is set right after the grant: an observer may see
            # the leader without it first (C2 #ct2-holder).
            o = until(obs, lambda o: o.value == b"a-1")
            self.assertEqual((o.leader, o.session, o.token, o.value, o.owner), (True, a.id, lead.token, b"a-1", "a"))
            lead.proclaim(b"a-2")
            o = next(obs)
            self.assertEqual((o.token, o.value), (lead.token, b"a-2"))
            got = []
            t = threading.Thread(target=lambda: got.append(bb.campaign("el/leader", b"b-1", timeout=20)))
            t.start()
            self.assertTrue(poll(lambda: c.inspect("el/leader").waiters == [bb.id]))
            lead.resign()
            t.join()
            self.assertTrue(lead.lost.is_set())
            self.assertGreater(got[0].token, lead.token)
            o = until(obs, lambda o: o.leader and o.value == b"b-1")
            self.assertEqual((o.session, o.token), (bb.id, got[0].token))
            with self.assertRaises(lockd.LockLost):
                lead.proclaim(b"late")
        self.each(run)

    def test_errors_by_reason(self):
        def run(b, c):
            with self.assertRaises(lockd.InvalidArgument):
                c.session(ttl=1)  # below the server's 2 s minimum: refused by the server
            with self.assertRaises(lockd.InvalidArgument):
                c.inspect("")
            with self.assertRaises(lockd.InvalidArgument):
                lockd.Client("10.1.2.3:7420")  # remote plaintext
            s = c.session()
            lock = s.acquire("err/k")
            s2 = c.session()
            s2._secret = b"y" * 32  # a session secret that is not the session's
            with self.assertRaises(lockd.PermissionDenied) as cm:
                s2.try_acquire("err/other")
            self.assertEqual(cm.exception.reason, "SESSION_SECRET_MISMATCH")
            lock.release()
            s.close()
            with self.assertRaises(lockd.Closed):
                s.acquire("err/k")
        self.each(run)


if __name__ == "__main__":
    unittest.main()
