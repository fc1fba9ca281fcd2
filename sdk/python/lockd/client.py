"""Client: the connection to lockd and the calls that need no session."""

from __future__ import annotations

import logging
import random
import threading

import grpc

from . import _conn, _hotkeys, _trace, errors
from ._cancel import Cancel
from ._clock import Clock, Timers
from ._hotkeys import HotKeys
from ._keepalive import Keepaliver
from ._types import LockInfo, TokenCheck, lock_info
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

#: the shortest heartbeat interval accepted (as lock.client.heartbeat-interval)
MIN_HEARTBEAT_INTERVAL = 0.1
#: bounds the best-effort CloseSession calls of close() and of an expired session
CLOSE_TIMEOUT = 2.0
MAX_KEY = 512


def check_timing(ttl: float, margin: float, interval: float) -> None:
    """The C5 timing rules (docs/contracts/C2.md #ct2-sdk rule 2): 0 < margin <
    ttl/2, MIN_HEARTBEAT_INTERVAL <= interval <= ttl - 2*margin, interval <
    ttl. A 0 means "not known yet" and is not checked."""
    if margin < 0 or interval < 0 or ttl < 0:
        raise errors.InvalidArgument(f"negative safety margin ({margin}), heartbeat interval ({interval}) or ttl ({ttl})")
    if ttl > 0 and margin > 0 and margin >= ttl / 2:
        raise errors.InvalidArgument(f"safety margin {margin}s must be > 0 and < ttl/2 (ttl {ttl}s)", field="safety_margin")
    if 0 < interval < MIN_HEARTBEAT_INTERVAL:
        raise errors.InvalidArgument(f"heartbeat interval {interval}s is below the minimum {MIN_HEARTBEAT_INTERVAL}s",
                                     field="heartbeat_interval")
    if ttl > 0 and margin > 0 and interval > ttl - 2 * margin:
        raise errors.InvalidArgument(
            f"heartbeat interval {interval}s must be at most ttl - 2 x safety margin = {ttl - 2 * margin:g}s "
            f"(ttl {ttl}s, margin {margin}s)", field="heartbeat_interval")
    if ttl > 0 and interval >= ttl:
        raise errors.InvalidArgument(f"heartbeat interval {interval}s must be below the ttl {ttl}s",
                                     field="heartbeat_interval")


def validate_key(key: str, field: str = "key") -> None:
    if not isinstance(key, str):
        raise errors.InvalidArgument(f"{field}: not a str", field=field)
    b = key.encode("utf-8", "surrogatepass")
    if not 1 <= len(b) <= MAX_KEY:
        raise errors.InvalidArgument(f"{field}: {len(b)} bytes, want 1..{MAX_KEY}", field=field)
    if "\x00" in key:
        raise errors.InvalidArgument(f"{field}: holds a NUL byte", field=field)


class Client:
    """A client of lockd. ``target`` is host:port, or several replicas of one
    backend as "a:7420,b:7420" (also ``addresses``): the client uses one at a
    time and moves when it dies, drains or stalls (docs/contracts/C2.md
    #ct2-failover). Plaintext only to loopback unless ``insecure``; else pass
    ``tls=lockd.TLS(ca_file, cert_file, key_file)``. ``token`` or
    ``token_file``: a bearer token sent with every call. ``tracer_provider``
    (an OpenTelemetry ``TracerProvider``) makes every unary call a client
    span carrying W3C trace context (docs/contracts/C4.md #ct4-traces).

    ``ttl``, ``safety_margin`` and ``heartbeat_interval`` (seconds) override
    the server's defaults for every session; ``call_timeout`` bounds how long
    a call without its own timeout retries retryable errors.

    All sessions of a client share one KeepAlive stream, kept by a background
    thread that ``close()`` stops and joins (also on ``with`` exit).
    """

    def __init__(self, target: str = "", *, addresses=None, tls: _conn.TLS | None = None, insecure: bool = False,
                 token: str | None = None, token_file: str | None = None, ttl: float = 0,
                 safety_margin: float = 0, heartbeat_interval: float = 0,
                 backoff: tuple[float, float] = (0.05, 2.0), call_timeout: float = 30.0,
                 clock: Clock | None = None, tracer_provider=None, _stub_factory=None):
        addrs = list(addresses) if addresses else [a.strip() for a in target.split(",") if a.strip()]
        if token is not None and token_file is not None:
            raise errors.InvalidArgument("give token or token_file, not both", field="token")
        if token_file is not None:
            token = _conn.read_token_file(token_file)
        if not 0 < backoff[0] <= backoff[1]:
            raise errors.InvalidArgument("backoff bounds must satisfy 0 < min <= max", field="backoff")
        check_timing(ttl, safety_margin, heartbeat_interval)
        self._tracing = _trace.tracing(tracer_provider)
        self.clock = clock or Clock()
        self.conn = _conn.Conn(addrs, tls, insecure, token, now=self.clock.now, stub_factory=_stub_factory, backoff=backoff)
        self.ttl, self.safety_margin, self.heartbeat_interval = ttl, safety_margin, heartbeat_interval
        self.backoff_min, self.backoff_max = backoff
        self.call_timeout = call_timeout
        self._closing = Cancel()
        self._mu = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self.timers = Timers(self.clock)
        self.ka = Keepaliver(self)

    def __repr__(self) -> str:
        return f"lockd.Client({','.join(self.conn.addresses)})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- sessions -------------------------------------------------------

    def session(self, ttl: float = 0, owner: str = "", labels: dict | None = None, lock_delay: float = 0,
                timeout: float | None = None):
        """Opens a session (a context manager that closes it). ``ttl`` in
        seconds (0: the client's, else the server's default); ``owner`` and
        ``labels`` say who holds its locks; ``lock_delay`` is every plain
        lock's default lock-delay."""
        from .session import Session
        return Session._open(self, ttl or self.ttl, owner, labels or {}, lock_delay, timeout)

    # --- calls ----------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        d = min(self.backoff_min * (2 ** min(attempt, 16)), self.backoff_max)
        return d / 2 + random.uniform(0, d / 2)

    def _sleep(self, d: float, cancel: Cancel | None = None) -> bool:
        """Waits d on the client's clock; False when cancel or close came first."""
        cv = threading.Condition()
        stop = [False]

        def wake():
            with cv:
                stop[0] = True
                cv.notify_all()
        r1 = self._closing.on_cancel(wake)
        r2 = cancel.on_cancel(wake) if cancel else (lambda: None)
        try:
            until = self.clock.now() + d
            with cv:
                while not stop[0] and self.clock.now() < until:
                    self.clock.wait(cv, until)
                return not stop[0]
        finally:
            r1()
            r2()

    def _call(self, method: str, req, *, timeout: float | None = -1.0, cancel: Cancel | None = None,
              on_error=None):
        """Calls method until it succeeds, fails for good, timeout (seconds;
        -1: call_timeout; None: no bound) runs out or cancel fires. Returns
        (reply, send time). on_error(err) sees every failed attempt."""
        if timeout == -1.0:
            timeout = self.call_timeout
        until = None if timeout is None else self.clock.now() + timeout
        last: errors.LockdError | None = None
        attempt = 0
        while True:
            if self._closing.cancelled:
                raise errors.Closed("client closed")
            if cancel is not None and cancel.cancelled:
                raise errors.Cancelled("cancelled") from last
            addr, stub = self.conn.pick()
            rem = None if until is None else until - self.clock.now()
            if rem is not None and rem <= 0:
                raise (last or errors.DeadlineExceeded(f"{method}: timed out"))
            md, span, code = self.conn.metadata, None, grpc.StatusCode.UNKNOWN
            if self._tracing is not None:
                span, md = self._tracing.start(method, md)
            sent = self.clock.now()
            fut = getattr(stub, method).future(req, metadata=md, timeout=rem)
            undo = [c.on_cancel(fut.cancel) for c in (cancel, self._closing) if c is not None]
            try:
                resp = fut.result()
                code = grpc.StatusCode.OK
                return resp, sent
            except grpc.FutureCancelledError:
                code = grpc.StatusCode.CANCELLED
                if self._closing.cancelled:
                    raise errors.Closed("client closed") from None
                raise errors.Cancelled("cancelled") from last
            except grpc.RpcError as e:
                code = e.code() if isinstance(e.code(), grpc.StatusCode) else grpc.StatusCode.UNKNOWN
                err = errors.from_rpc(e)
            finally:
                for u in undo:
                    u()
                if span is not None:
                    self._tracing.end(span, code)
            if isinstance(err, errors.Cancelled) and cancel is not None and cancel.cancelled:
                raise err from last
            if on_error is not None:
                on_error(err)
            if not err.retryable:
                if isinstance(err, errors.DeadlineExceeded) and last is not None:
                    raise last
                raise err
            self.conn.after_error(addr, err)
            last = err
            log.debug("retrying %s: %s", method, err)
            d = self._backoff(attempt)
            attempt += 1
            if until is not None:
                d = min(d, max(0.0, until - self.clock.now()))
            if not self._sleep(d, cancel):
                if self._closing.cancelled:
                    raise errors.Closed("client closed") from last
                raise errors.Cancelled("cancelled") from last

    def inspect(self, key: str, timeout: float | None = -1.0) -> LockInfo:
        """Describes key: its holder(s), token and waiters."""
        validate_key(key)
        resp, _ = self._call("Inspect", pb.InspectRequest(key=key), timeout=timeout)
        if not resp.held:
            return LockInfo(key=key, delay_remaining=resp.lock.delay_remaining_ms / 1000.0)
        return lock_info(resp.lock)

    def check_token(self, key: str, token: int, cached: bool = False, timeout: float | None = -1.0) -> TokenCheck:
        """Whether (key, token) is a current grant of key: Chubby's
        CheckSequencer, for a resource handed a fencing token (C2
        #ct2-check-token). A key nobody holds is not current. By default the
        server reads the backend; cached=True answers from its watch-fed
        index, at most one watch delivery delay behind. Needs read access to
        the key, like inspect."""
        validate_key(key)
        if not isinstance(token, int) or isinstance(token, bool) or token <= 0 or token >= 1 << 64:
            raise errors.InvalidArgument("token: want a fencing token (1 to 2**64-1)", field="token")
        consistency = pb.CHECK_CONSISTENCY_CACHED if cached else pb.CHECK_CONSISTENCY_LINEARIZABLE
        resp, _ = self._call("CheckToken", pb.CheckTokenRequest(key=key, token=token, consistency=consistency),
                             timeout=timeout)
        return TokenCheck(current=resp.current, tokens=list(resp.tokens), cached=resp.cached)

    def list(self, prefix: str = "", page_token: str = "", limit: int = 0, timeout: float | None = -1.0):
        """One page of the held keys starting with prefix: (infos, next page token or "")."""
        resp, _ = self._call("List", pb.ListRequest(prefix=prefix, page_token=page_token, limit=limit),
                             timeout=timeout)
        return [lock_info(p) for p in resp.locks], resp.next_page_token

    def hot_keys(self, prefix: str = "", limit: int = 0, timeout: float | None = -1.0) -> HotKeys:
        """Which keys under prefix the lockd process this client is connected
        to saw waited for and held most over its recent window (30 to 60 s),
        at most limit per ranking (0: 10; at most 50); see
        :class:`lockd.HotKeys` (C2 #ct2-hotkeys). Keys the caller may not
        read are left out; other replicas keep their own: ask each."""
        req = _hotkeys.request(prefix, limit)
        resp, _ = self._call("HotKeys", req, timeout=timeout)
        return _hotkeys.answer(resp)

    def revoke(self, key: str, timeout: float | None = -1.0) -> LockInfo:
        """Deletes key's grant whoever holds it; returns the revoked grant (held False: it was free)."""
        validate_key(key)
        resp, _ = self._call("Revoke", pb.RevokeRequest(key=key), timeout=timeout)
        if not resp.revoked:
            return LockInfo(key=key)
        return LockInfo(key=key, held=True, session=resp.session_id, token=resp.token)

    def close_sessions(self, principal: str, timeout: float | None = -1.0) -> tuple[int, int]:
        """Closes every live session bound to principal, as each session's own
        close would (its locks released, its client told at its next
        heartbeat): an admin remedy that needs admin on every key (C2
        #ct2-close-sessions). Returns (sessions closed, locks released).
        Retrying after an error is safe: what was closed stays closed."""
        resp, _ = self._call("CloseSessions", pb.CloseSessionsRequest(principal=principal), timeout=timeout)
        return resp.closed, resp.released

    def watch(self, prefix: str = "", holders: bool = False, cancel: Cancel | None = None,
              timeout: float | None = -1.0):
        """Every change to the keys starting with prefix, in commit order, as
        an iterator of :class:`lockd.Event` (see :class:`lockd.watch.Watch`).
        Returns once the watch is established."""
        from .watch import Watch
        return Watch._open(self, prefix, holders, cancel, timeout)

    def observe(self, name: str, cancel: Cancel | None = None):
        """The leader of election name as it changes: an iterator of
        :class:`lockd.Observation` (see :mod:`lockd.election`)."""
        from .election import Observer
        return Observer(self, name, cancel)

    # --- threads --------------------------------------------------------

    def _spawn(self, fn, name: str) -> None:
        """Runs fn on a thread the client owns and joins at close."""
        def run():
            try:
                fn()
            finally:
                with self._mu:
                    self._threads.discard(threading.current_thread())
        t = threading.Thread(target=run, name=name, daemon=True)
        with self._mu:
            if self._closing.cancelled:
                return
            self._threads.add(t)
        t.start()

    def close(self) -> None:
        """Closes every session (their locks are released on the server, best
        effort within CLOSE_TIMEOUT), stops and joins the client's threads and
        closes the channels. Idempotent."""
        if self._closing.cancelled:
            return
        sessions = self.ka.all()
        threads = []
        for s in sessions:
            t = threading.Thread(target=lambda s=s: s._close_quietly(CLOSE_TIMEOUT), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        self._closing.cancel()
        self.ka.stop()
        self.timers.stop()
        while True:
            with self._mu:
                ts = [t for t in self._threads if t is not threading.current_thread()]
            if not ts:
                break
            for t in ts:
                t.join()
        self.conn.close()
