"""Unit tests without a server: error mapping, address rotation, settings."""

import unittest

import grpc

import lockd
from lockd import _conn, _status, errors


def _ld(num, b):
    """A length-delimited protobuf field."""
    out = bytes([num << 3 | 2])
    n = len(b)
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n]) + b


def _status_bytes(reason, domain="lockd.lock.dev", field=None):
    info = _ld(1, reason.encode()) + _ld(2, domain.encode()) + _ld(3, _ld(1, b"limit") + _ld(2, b"sessions"))
    details = _ld(3, _ld(1, b"type.googleapis.com/google.rpc.ErrorInfo") + _ld(2, info))
    if field:
        bad = _ld(1, _ld(1, field.encode()) + _ld(2, b"too long"))
        details += _ld(3, _ld(1, b"type.googleapis.com/google.rpc.BadRequest") + _ld(2, bad))
    return bytes([8, 9]) + _ld(2, b"msg") + details


class _Err(grpc.RpcError):
    def __init__(self, code, details, trailers):
        self._c, self._d, self._t = code, details, trailers

    def code(self):
        return self._c

    def details(self):
        return self._d

    def trailing_metadata(self):
        return self._t


class ErrorsTest(unittest.TestCase):
    def test_by_reason(self):
        cases = {
            ("LIMIT_MISMATCH", grpc.StatusCode.INVALID_ARGUMENT): errors.LimitMismatch,
            ("SESSION_DEAD", grpc.StatusCode.FAILED_PRECONDITION): errors.SessionDead,
            ("NOT_OWNER", grpc.StatusCode.PERMISSION_DENIED): errors.NotOwner,
            ("ACCESS_DENIED", grpc.StatusCode.PERMISSION_DENIED): errors.PermissionDenied,
            ("SESSION_SECRET_MISMATCH", grpc.StatusCode.PERMISSION_DENIED): errors.PermissionDenied,
            ("UNAUTHENTICATED", grpc.StatusCode.UNAUTHENTICATED): errors.Unauthenticated,
            ("SHUTTING_DOWN", grpc.StatusCode.UNAVAILABLE): errors.ShuttingDown,
            ("CONTENTION", grpc.StatusCode.UNAVAILABLE): errors.Unavailable,
            ("WAIT_TIMEOUT", grpc.StatusCode.DEADLINE_EXCEEDED): errors.WaitTimeout,
            ("LIMIT", grpc.StatusCode.RESOURCE_EXHAUSTED): errors.LimitReached,
            ("INTERNAL", grpc.StatusCode.INTERNAL): errors.Internal,
        }
        for (reason, code), cls in cases.items():
            with self.subTest(reason):
                e = errors.from_rpc(_Err(code, "m", (("grpc-status-details-bin", _status_bytes(reason)),)))
                self.assertIs(type(e), cls)
                self.assertEqual(e.reason, reason)
        e = errors.from_rpc(_Err(grpc.StatusCode.RESOURCE_EXHAUSTED, "m",
                                 (("grpc-status-details-bin", _status_bytes("LIMIT")),)))
        self.assertEqual(e.limit, "sessions")
        self.assertTrue(errors.Unavailable().retryable and not errors.NotOwner().retryable)

    def test_deadlock_not_retried(self):
        # DEADLOCK travels with ABORTED, which the SDK retries without a
        # reason; DEADLOCK itself never is (C2 #ct2-deadlock).
        info = _ld(1, b"DEADLOCK") + _ld(2, b"lockd.lock.dev") + _ld(3, _ld(1, b"keys") + _ld(2, b'["a","b"]'))
        st = bytes([8, 10]) + _ld(2, b"msg") + _ld(3, _ld(1, b"type.googleapis.com/google.rpc.ErrorInfo") + _ld(2, info))
        e = errors.from_rpc(_Err(grpc.StatusCode.ABORTED, "m", (("grpc-status-details-bin", st),)))
        self.assertIs(type(e), lockd.Deadlock)
        self.assertEqual((e.keys, e.retryable, e.reason), (["a", "b"], False, "DEADLOCK"))
        self.assertTrue(errors.from_rpc(_Err(grpc.StatusCode.ABORTED, "m", ())).retryable)

    def test_by_code_and_field(self):
        # No details (an older server): the code decides; a reason-less
        # PERMISSION_DENIED is NOT_OWNER.
        self.assertIs(type(errors.from_rpc(_Err(grpc.StatusCode.PERMISSION_DENIED, "m", ()))), errors.NotOwner)
        self.assertIs(type(errors.from_rpc(_Err(grpc.StatusCode.DEADLINE_EXCEEDED, "m", ()))), errors.DeadlineExceeded)
        e = errors.from_rpc(_Err(grpc.StatusCode.INVALID_ARGUMENT, "m",
                                 (("grpc-status-details-bin", _status_bytes("INVALID_ARGUMENT", field="key")),)))
        self.assertEqual((type(e), e.field, str(e)), (errors.InvalidArgument, "key", "key: too long"))
        # Another domain's reason is not lockd's; garbage is ignored.
        e = errors.from_rpc(_Err(grpc.StatusCode.UNAVAILABLE, "m",
                                 (("grpc-status-details-bin", _status_bytes("SHUTTING_DOWN", domain="x")),)))
        self.assertIs(type(e), errors.Unavailable)
        self.assertEqual(_status.decode(b"\xff\xff\xff", "lockd.lock.dev").reason, "")


class ConnTest(unittest.TestCase):
    def conn(self, t):
        return _conn.Conn(["a:1", "b:1", "c:1"], None, True, None, now=lambda: t[0], stub_factory=lambda a: a)

    def test_never_stuck_on_a_dead_address(self):
        t = [0.0]
        c = self.conn(t)
        self.assertEqual(c.pick()[0], "a:1")
        self.assertTrue(c.set_aside("a:1", draining=True))  # a drains
        self.assertEqual(c.pick()[0], "b:1")
        c.failed("b:1")  # b is killed
        self.assertEqual(c.pick()[0], "c:1")
        # c stalls with every other address aside: it is kept (no hopping).
        self.assertFalse(c.set_aside("c:1"))
        for _ in range(3):
            self.assertEqual(c.pick()[0], "c:1")
        c.failed("c:1")  # every address aside now: try them all again
        self.assertIn(c.pick()[0], ["a:1", "b:1", "c:1"])
        t[0] += _conn.ASIDE_FOR + 1
        self.assertIsNotNone(c.pick())

    def test_live_replica_answer_keeps_it(self):
        """Only a call without an answer (UNAVAILABLE, no lockd reason) or
        SHUTTING_DOWN moves on; a retryable answer of a live replica keeps it
        (C2 #ct2-sdk rule 8, as the Go and TypeScript SDKs). Before, b's
        "backend contention" set b aside too, every address was aside, and
        pick() went back to the dead a: test/sdk's AioFailoverRealTest
        test_kill_replica failed so once under load ("a:1 != b:1" here)."""
        c = _conn.Conn(["a:1", "b:1"], None, True, None, now=lambda: 0.0, stub_factory=lambda a: a)
        self.assertEqual(c.pick()[0], "a:1")
        c.after_error("a:1", errors.from_code(grpc.StatusCode.UNAVAILABLE, "", "connection reset"))  # a killed
        self.assertEqual(c.pick()[0], "b:1")
        for reason in ("CONTENTION", "NOT_LEADER", "UNAVAILABLE"):
            c.after_error("b:1", errors.from_code(grpc.StatusCode.UNAVAILABLE, reason, "backend contention; retry"))
            self.assertEqual(c.pick()[0], "b:1", reason)
        c.after_error("b:1", errors.from_code(grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", "server is shutting down"))
        self.assertEqual(c.pick()[0], "a:1")

    def test_transport_rules(self):
        self.assertTrue(_conn.loopback("127.0.0.1:7420") and _conn.loopback("[::1]:1") and _conn.loopback("localhost:1"))
        self.assertFalse(_conn.loopback("10.0.0.1:7420") or _conn.loopback("lockd.example:7420"))
        with self.assertRaises(lockd.InvalidArgument):
            _conn.Conn(["lockd.example:7420"], None, False, None)
        with self.assertRaises(lockd.InvalidArgument):
            _conn.Conn(["127.0.0.1:1"], None, False, "two\nlines")
        c = _conn.Conn(["127.0.0.1:1"], None, False, "tok-abc")
        self.assertNotIn("tok-abc", repr(c))


if __name__ == "__main__":
    unittest.main()
