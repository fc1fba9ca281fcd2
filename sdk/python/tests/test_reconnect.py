"""lockd.aio's channel reconnects within the client's backoff (C2 #ct2-sdk rule
11), not after gRPC's default (1 s growing by 1.6 up to 120 s): an address that
closes every connection (a server not back yet) sees an attempt at least every
second while a call retries for 3 s. gRPC's default makes its third attempt at
least 2 s after the second (measured: attempts at 0.01, 1.01 and 2.45 s).

The sync client gets the same channel options, but its channel made only two
attempts in 3 s (at 0.02 and 0.12 s) in the same test, with the options or
without: not understood yet, so not asserted here (docs/reliability.md)."""

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
        self.assertGreaterEqual(len(srv.attempts), 4, f"attempts at {srv.attempts}")
        self.assertLess(srv.longest_gap(), 1.0, "a gap between connection attempts over 1 s (the backoff's max is 0.2 s)")

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
