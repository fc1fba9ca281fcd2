"""The channel reconnects within the client's backoff (C2 #ct2-sdk rule 11), not
after gRPC's default (1 s growing by 1.6 up to 120 s): an address that closes
every connection (a server not back yet) sees an attempt at least every 1.5 s
while a call retries for 3 s, from lockd.aio and from the sync client, whose
C-core channel waits at least grpc.min_reconnect_backoff_ms between later
attempts (the SDK sets it to max, at least 1 s; its default is 20 s).
Measured with gRPC's defaults: lockd.aio's attempts at 0, 1.0 and 2.8 s; the
sync client's at 0 and 1.0 s, then 5 s."""

import socket
import threading
import time
import unittest

import lockd
import lockd.aio

from .test_aio_timing import run


class _Closer:
    """A listener that accepts and closes every connection, recording when."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.attempts = []
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.attempts.append(time.monotonic())
            conn.close()

    def close(self):
        self.sock.close()
        self.t.join(5)

    def longest_gap(self):
        a = self.attempts
        return max((a[i] - a[i - 1] for i in range(1, len(a))), default=float("inf"))


class ReconnectTest(unittest.TestCase):
    def check(self, srv):
        srv.close()
        self.assertGreaterEqual(len(srv.attempts), 3, f"attempts at {srv.attempts}")
        self.assertLess(srv.longest_gap(), 1.5, "a gap between connection attempts over 1.5 s (the backoff's max is "
                                                "0.2 s; the sync channel's floor 1 s)")

    def test_sync(self):
        srv = _Closer()
        c = lockd.Client(srv.addr, backoff=(0.02, 0.2))
        try:
            with self.assertRaises(lockd.errors.LockdError):
                c.inspect("k", timeout=3.0)
        finally:
            c.close()
        self.check(srv)

    def test_aio(self):
        srv = _Closer()

        async def body():
            async with lockd.aio.Client(srv.addr, backoff=(0.02, 0.2)) as c:
                with self.assertRaises(lockd.errors.LockdError):
                    await c.inspect("k", timeout=3.0)
        run(body())
        self.check(srv)


if __name__ == "__main__":
    unittest.main()
