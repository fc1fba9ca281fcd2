"""A fake LockService for the SDK's timing tests (fake clock). It is no
stand-in for lockd's conformance: the integration tests (test_integration.py)
run against a real lockd on etcd and PostgreSQL. It answers the way C2
says a server answers, and lets a test move the clock inside a call, choose
Remaining, drop or strip notices and take away grants."""

from __future__ import annotations

import itertools
import queue
import threading

import grpc

from lockd.v1 import lockd_pb2 as pb


class _Future:
    def __init__(self, fn):
        self._fn = fn

    def result(self):
        return self._fn()

    def cancel(self):
        return False


class _Method:
    def __init__(self, fn):
        self._fn = fn

    def future(self, req, metadata=None, timeout=None):
        return _Future(lambda: self._fn(req))

    def __call__(self, req, metadata=None, timeout=None):
        return self._fn(req)


class _Stream:
    """The reply side of a fake KeepAlive stream."""

    def __init__(self, server, requests):
        self.server = server
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.gen = next(server._gens)
        self.requests = requests
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            for r in self.requests:
                self.server._heartbeat(self, r)
        except Exception:
            pass
        self.out.put(None)

    def push(self, r):
        self.out.put(r)

    def cancel(self):
        self.out.put(None)

    def __iter__(self):
        return self

    def __next__(self):
        r = self.out.get()
        if r is None:
            raise StopIteration
        return r


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"

    def trailing_metadata(self):
        return ()


class _DeadStream:
    """A KeepAlive stream to a server that is down: it breaks at once with
    UNAVAILABLE, as grpcio's stream does when the dial fails."""

    def cancel(self):
        pass

    def __iter__(self):
        return self

    def __next__(self):
        raise _Unavailable()


class FakeServer:
    def __init__(self, clock, ttl=60.0, remaining=10.0, margin=0.5, interval=2.0):
        self.clock = clock
        self.mu = threading.Lock()
        self.ttl, self.remaining, self.margin, self.interval = ttl, remaining, margin, interval
        self.during: dict[str, object] = {}   # method -> fn() run while the call is "at the server"
        self.held: dict[str, dict[str, int]] = {}  # session -> key -> token
        self.pending: dict[str, list] = {}     # session -> unacknowledged LockLost notices
        self.acks: list[tuple[int, int]] = []  # (stream gen, notice id) received
        self.streams: list[_Stream] = []
        self.send_held = True
        self.strip_notices = False
        self.drop_push = False
        self.heartbeats = 0
        self.fail_heartbeats = False  # answer every heartbeat with an error (UNAVAILABLE), counted in failed
        self.failed = 0
        self.down = False      # KeepAlive streams break at once (UNAVAILABLE)
        self.dials: list[float] = []  # clock time of every KeepAlive stream opened
        self._tokens = itertools.count(100)
        self._notices = itertools.count(1)
        self._gens = itertools.count(1)
        self._sessions = itertools.count(1)
        self.OpenSession = _Method(self._open)
        self.Acquire = _Method(self._acquire)
        self.Release = _Method(self._release)
        self.CloseSession = _Method(lambda r: pb.CloseSessionResponse())
        self.LeaveQueue = _Method(lambda r: pb.LeaveQueueResponse())

    def stub(self, addr):
        return self

    def KeepAlive(self, requests, metadata=None):
        with self.mu:
            self.dials.append(self.clock.now())
            if self.down:
                return _DeadStream()
        s = _Stream(self, requests)
        with self.mu:
            self.streams.append(s)
        return s

    def _hook(self, name):
        fn = self.during.get(name)
        if fn:
            fn()

    def _open(self, req):
        self._hook("OpenSession")
        sid = f"s{next(self._sessions)}"
        with self.mu:
            self.held[sid] = {}
            self.pending[sid] = []
        return pb.OpenSessionResponse(session_id=sid, ttl_ms=int(self.ttl * 1000), remaining_ms=int(self.remaining * 1000),
                                      safety_margin_ms=int(self.margin * 1000),
                                      heartbeat_interval_ms=int(self.interval * 1000), session_secret=b"x" * 32)

    def _acquire(self, req):
        self._hook("Acquire")
        with self.mu:
            tok = next(self._tokens)
            self.held[req.session_id][req.key] = tok
        return pb.AcquireResponse(granted=True, key=req.key, token=tok, remaining_ms=int(self.remaining * 1000))

    def _release(self, req):
        with self.mu:
            if self.held.get(req.session_id, {}).get(req.key) == req.token:
                del self.held[req.session_id][req.key]
        return pb.ReleaseResponse()

    def revoke(self, sid, key):
        """Takes a grant away and pushes its notice (unless drop_push)."""
        with self.mu:
            tok = self.held[sid].pop(key)
            n = pb.LockLost(key=key, token=tok, reason=pb.LOCK_LOST_REASON_REVOKED, notice_id=next(self._notices))
            self.pending[sid].append(n)
            streams = list(self.streams)
        if not self.drop_push and not self.strip_notices:
            for s in streams:
                s.push(pb.KeepAliveResponse(session_id=sid, live=True, lost=[n]))
        return n

    def _heartbeat(self, stream, r):
        self._hook("Heartbeat")
        with self.mu:
            if self.fail_heartbeats:
                self.failed += 1
                resp = pb.KeepAliveResponse(session_id=r.session_id, request_id=r.request_id, live=True,
                                            error=pb.SessionError(code=14, reason="UNAVAILABLE", message="backend unavailable"))
                stream.push(resp)
                return
            self.heartbeats += 1
            for a in r.ack:
                self.acks.append((stream.gen, a))
            p = self.pending.get(r.session_id, [])
            p[:] = [n for n in p if n.notice_id not in set(r.ack)]
            resp = pb.KeepAliveResponse(session_id=r.session_id, request_id=r.request_id, live=True,
                                        remaining_ms=int(self.remaining * 1000))
            if not self.strip_notices:
                resp.lost.extend(p)
            if self.send_held:
                resp.held.SetInParent()
                for k, t in self.held.get(r.session_id, {}).items():
                    resp.held.locks.add(key=k, token=t)
        stream.push(resp)
