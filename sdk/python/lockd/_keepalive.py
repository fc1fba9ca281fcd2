"""The shared KeepAlive stream of a Client: the heartbeat schedule, replies
and notices, reconnects and replica moves (docs/contracts/C2.md #ct2-sdk
rules 1, 4-8).

One thread (lockd-keepalive) sends the heartbeats of every session; a
receiver thread per stream applies replies as they arrive. A stream left on
purpose (draining, stalled) keeps its receiver until the heartbeats in flight
on it are answered or forgotten (a lingerer thread). A stream left because it
stalled is also still sent heartbeats until a later stream answers (a shadow:
a stall is a guess, and a replica that is slow but answering must not lose
the session by it; C2 #ct2-failover, "a stall move keeps sending").
Client.close() stops and joins all of them.
"""

from __future__ import annotations

import logging
import queue
import random
import threading

import grpc

from . import errors
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

MAX_BEAT_SLACK = 0.05
MIN_STALL = 0.25
MAX_SHADOWS = 4  # stalled streams still sent heartbeats; an older one is only received on


def beat_slack(interval: float) -> float:
    """How much earlier than due a heartbeat may go: interval/10, at most 50 ms."""
    return min(interval / 10, MAX_BEAT_SLACK)


def stall_after(interval: float) -> float:
    return max(interval / 2, MIN_STALL)


def forget_unanswered(fl, now: float):
    """Forgets the heartbeats of fl unanswered for a TTL after their send
    (C2 #ct2-failover) and returns (oldest send left or None, the stall
    bound of the sessions still in flight or None, fl.last_recv): what the
    stall check reads, for the threads' and lockd.aio's loops alike."""
    oldest, stall = None, None
    with fl.mu:
        for rid, (s, sent, _) in list(fl.beats.items()):
            if now - sent > s.ttl:
                del fl.beats[rid]
                continue
            oldest = sent if oldest is None else min(oldest, sent)
            st = stall_after(s.interval)
            stall = st if stall is None else min(stall, st)
        return oldest, stall, fl.last_recv


def jitter(interval: float) -> float:
    """A random point in the last fifth of interval."""
    return interval - random.uniform(0, interval / 5)


class _Flight:
    """The heartbeats of one stream awaiting their answer."""

    def __init__(self, gen: int, now: float):
        self.mu = threading.Lock()
        self.beats: dict[int, tuple] = {}  # request id -> (session, sent, seq)
        self.replied = False  # anything came on it (a healthy stream: the backoff)
        self.kept = False  # a live answer to one of its heartbeats came: its replica keeps the session
        self.gen = gen
        self.last_recv = now
        self.draining = False
        self.broken = None
        self.left = False
        self.stalled = False  # left because it stalled
        self.sending = False  # a stalled stream still sent heartbeats (a shadow; guarded by Keepaliver.cv)
        self.q = None  # its request queue while it is a shadow
        self.next_id = 0  # the last request id sent on it

    def ack_gen(self) -> int:
        return 0 if self.left else self.gen


class Keepaliver:
    def __init__(self, c):
        self.c = c
        self.cv = threading.Condition()
        self.sessions: dict[str, list] = {}  # id -> [session, next beat]
        self.stopped = False
        self.poked = False
        self.gen = 0
        self._lingerers: set[threading.Thread] = set()
        self._shadows: list[_Flight] = []  # the sender thread's; each one's sending under cv
        self.thread = threading.Thread(target=self.run, name="lockd-keepalive", daemon=True)
        self.thread.start()

    def poke(self) -> None:
        with self.cv:
            self.poked = True
            self.cv.notify_all()

    def add(self, s) -> None:
        with self.cv:
            self.sessions[s.id] = [s, self.c.clock.now() + jitter(s.interval)]
            self.poked = True
            self.cv.notify_all()

    def remove(self, s) -> None:
        with self.cv:
            e = self.sessions.get(s.id)
            if e is not None and e[0] is s:
                del self.sessions[s.id]

    def all(self) -> list:
        with self.cv:
            return [e[0] for e in self.sessions.values()]

    def lookup(self, sid: str):
        with self.cv:
            e = self.sessions.get(sid)
            return e[0] if e else None

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
        self.thread.join()
        while True:
            with self.cv:
                ts = list(self._lingerers)
            if not ts:
                return
            for t in ts:
                t.join()

    # --- schedule -------------------------------------------------------

    def beat_soon(self, s, after: float) -> None:
        """Moves s's next heartbeat to at most after seconds from now."""
        with self.cv:
            e = self.sessions.get(s.id)
            if e is not None and e[0] is s:
                soon = self.c.clock.now() + after
                if soon < e[1]:
                    e[1] = soon
                    self.poked = True
                    self.cv.notify_all()

    def beat_before_deadline(self, s) -> None:
        """After a live answer: the next heartbeat no later than halfway to
        the earliest deadline, no sooner than beat_slack (C2 #ct2-deadline)."""
        at = s.earliest_deadline()
        if at is not None:
            self.beat_soon(s, max((at - self.c.clock.now()) / 2, beat_slack(s.interval)))

    # --- replies --------------------------------------------------------

    def handle(self, r, fl: _Flight) -> None:
        if r.draining:
            with self.cv:
                fl.draining = True
                self.cv.notify_all()
        b = None
        if r.request_id:
            with fl.mu:
                b = fl.beats.pop(r.request_id, None)
            if b is not None:
                with self.cv:
                    self.cv.notify_all()  # a lingerer looks again
        s = b[0] if b is not None else self.lookup(r.session_id)
        if s is None or s.id != r.session_id:
            return
        ack = False
        for n in r.lost:
            ack = s._lock_lost(n, fl.ack_gen()) or ack
        if ack and r.live:
            self.beat_soon(s, 0)  # acknowledge at once: the server repeats the notice until then
        held = r.held if r.HasField("held") else None
        if r.HasField("error"):
            err = errors.from_session_error(r.error.code, r.error.reason, r.error.message)
            log.debug("heartbeat failed: %s", err)
            if isinstance(err, errors.PermissionDenied):
                s._end(err)  # the server refuses this session's secret: no heartbeat can succeed
                return
            if b is not None:
                if held is not None:
                    s._answer(b[1], b[2], False, 0.0, held)
                self.beat_soon(s, min(s.interval / 2, 1.0))
        elif not r.live:
            s._end(errors.SessionDead("the server reports the session dead"))
        elif b is not None:
            with fl.mu:
                fl.kept = True  # the shadows stop (a notice or an error answer does not stop them)
            s._answer(b[1], b[2], True, r.remaining_ms / 1000.0, held)
            self.beat_before_deadline(s)

    # --- streams --------------------------------------------------------

    def run(self) -> None:
        clock = self.c.clock
        attempt = 0
        while True:
            with self.cv:
                while not self.sessions and not self.stopped:
                    clock.wait(self.cv, None)
                if self.stopped:
                    return
            start = clock.now()
            try:
                healthy, moved = self.stream()
            except errors.Closed:
                return
            if self.stopped:
                return
            if moved:
                attempt = 0
                continue
            if healthy or clock.now() - start > 10:
                attempt = 0
            if not healthy or attempt > 0:
                if not self.c._sleep(self.c._backoff(attempt)):
                    return
            attempt += 1

    def stream(self):
        """Runs one KeepAlive stream until it breaks, the client stops, or the
        SDK leaves its replica; returns (healthy, moved)."""
        c, clock = self.c, self.c.clock
        addr, stub = c.conn.pick()
        q: queue.SimpleQueue = queue.SimpleQueue()

        def requests():
            while True:
                r = q.get()
                if r is None:
                    return
                yield r
        try:
            call = stub.KeepAlive(requests(), metadata=c.conn.metadata)
        except grpc.RpcError as e:
            log.debug("keepalive stream failed: %s", e)
            return False, False
        self.gen += 1
        fl = _Flight(self.gen, clock.now())

        def receive():
            try:
                for r in call:
                    with fl.mu:
                        fl.replied = True
                        fl.last_recv = clock.now()
                    self.handle(r, fl)
                fl.broken = "stream ended"
            except grpc.RpcError as e:
                fl.broken = e
            except Exception as e:  # never leave the stream without a reader
                log.exception("keepalive receiver failed")
                fl.broken = e
            with self.cv:
                self.cv.notify_all()
        rt = threading.Thread(target=receive, name="lockd-keepalive-recv", daemon=True)
        rt.start()
        moved = False
        try:
            moved = self._send(addr, q, fl)
        finally:
            if moved and fl.stalled:
                self._add_shadow(fl, q)  # q stays open: heartbeats still go on it
            else:
                q.put(None)
            if moved:
                fl.left = True
                t = threading.Thread(target=self._linger, args=(call, rt, fl), name="lockd-keepalive-linger",
                                     daemon=True)
                with self.cv:
                    self._lingerers.add(t)
                t.start()
            else:
                call.cancel()
                rt.join()
        with fl.mu:
            healthy = fl.replied
        if isinstance(fl.broken, grpc.RpcError) and not moved:
            err = errors.from_rpc(fl.broken)
            c.conn.after_error(addr, err)
            log.debug("keepalive stream broke: %s", err)
        return healthy, moved

    def _send(self, addr: str, q, fl: _Flight) -> bool:
        """The sender loop of a stream; True when it left the replica on purpose."""
        c, clock = self.c, self.c.clock
        with self.cv:
            now = clock.now()
            for e in self.sessions.values():
                e[1] = now  # every session beats at once on a new stream
        drain_seen = False
        stall_done = False
        while True:
            due = []
            with self.cv:
                if self.stopped:
                    return False
                now = clock.now()
                nxt = now + 3600
                for e in self.sessions.values():
                    if now + beat_slack(e[0].interval) >= e[1]:
                        due.append(e[0])
                        e[1] = now + jitter(e[0].interval)
                    nxt = min(nxt, e[1])
            for s in due:
                fl.next_id += 1
                seq, acks = s._beat_state(fl.gen)
                sent = clock.now()
                with fl.mu:
                    fl.beats[fl.next_id] = (s, sent, seq)
                q.put(pb.KeepAliveRequest(session_id=s.id, session_secret=s._secret, request_id=fl.next_id, ack=acks))
            self._send_shadows(fl, due)
            # Forget heartbeats unanswered for a TTL; find a stall.
            oldest, stall, last_recv = forget_unanswered(fl, now)
            if c.conn.several and not stall_done and oldest is not None:
                at = max(oldest, last_recv) + stall
                if now >= at:
                    if c.conn.set_aside(addr):
                        log.debug("keepalive stream stalled: moving from %s", addr)
                        fl.stalled = True
                        return True
                    stall_done = True
                else:
                    nxt = min(nxt, at)
            with self.cv:
                if fl.broken is not None:
                    return False
                if fl.draining and not drain_seen:
                    drain_seen = True
                    if c.conn.several and c.conn.set_aside(addr, draining=True):
                        log.debug("replica %s draining: moving", addr)
                        return True
                if not self.poked and not self.stopped:
                    clock.wait(self.cv, nxt)
                self.poked = False
                if fl.broken is not None:
                    return False

    # --- a stall move keeps sending (C2 #ct2-failover) -------------------

    def _add_shadow(self, fl: _Flight, q) -> None:
        with self.cv:
            fl.q, fl.sending = q, True
            self._shadows.append(fl)
            if len(self._shadows) > MAX_SHADOWS:
                self._stop_shadow_locked(self._shadows.pop(0))

    def _stop_shadow_locked(self, fl: _Flight) -> None:
        """Ends the heartbeats sent on a stalled stream (cv held): it is then
        only received on until its answers came or were forgotten."""
        fl.sending = False
        fl.q.put(None)
        self.cv.notify_all()  # its lingerer looks again

    def _live_shadows(self, cur: _Flight) -> list:
        """Stops the shadows once the stream in use (cur) carried a live answer
        to a heartbeat (not a notice, not an error answer: C2 #ct2-failover),
        or when their replica drains or their stream ended; returns the others."""
        with cur.mu:
            kept = cur.kept
        with self.cv:
            for sh in list(self._shadows):
                if kept or sh.draining or sh.broken is not None:
                    self._shadows.remove(sh)
                    self._stop_shadow_locked(sh)
            return list(self._shadows)

    def _shadow_beats(self, sh: _Flight, due: list) -> list:
        """The heartbeats to send on shadow sh, recorded in its flight: every
        due session's that has none in flight there, without
        acknowledgements (they go only on the stream in use). A heartbeat
        unanswered there for a TTL is forgotten first, as on any stream: a
        replica that answers nothing must not keep a session out of the sends
        for good (C2 #ct2-failover)."""
        now = self.c.clock.now()
        with sh.mu:
            for rid, (s, sent, _) in list(sh.beats.items()):
                if now >= sent + s.ttl:
                    del sh.beats[rid]
            busy = {id(b[0]) for b in sh.beats.values()}
        out = []
        for s in due:
            if id(s) in busy:
                continue
            sh.next_id += 1
            with sh.mu:
                sh.beats[sh.next_id] = (s, self.c.clock.now(), s._beat_seq())
            out.append(pb.KeepAliveRequest(session_id=s.id, session_secret=s._secret, request_id=sh.next_id))
        return out

    def _send_shadows(self, cur: _Flight, due: list) -> None:
        sent = False
        for sh in self._live_shadows(cur):
            for req in self._shadow_beats(sh, due):
                sh.q.put(req)
                sent = True
        if sent:
            with self.cv:
                self.cv.notify_all()  # the lingerers look again: a timer to forget what was sent

    def _linger(self, call, rt: threading.Thread, fl: _Flight) -> None:
        """Receives on a stream left on purpose until it is sent nothing more
        and its heartbeats are answered or forgotten (a TTL after their send),
        it breaks, or stop."""
        clock = self.c.clock
        try:
            with self.cv:
                while not self.stopped and fl.broken is None:
                    now = clock.now()
                    until = None
                    with fl.mu:
                        for rid, (s, sent, _) in list(fl.beats.items()):
                            if now >= sent + s.ttl:
                                del fl.beats[rid]
                                continue
                            until = sent + s.ttl if until is None else max(until, sent + s.ttl)
                    if until is None and not fl.sending:
                        break
                    clock.wait(self.cv, until)  # None: a shadow with nothing in flight waits for a notify
        finally:
            if fl.q is not None:
                fl.q.put(None)  # a shadow's requests end too (a second None is never read)
            call.cancel()
            rt.join()
            with self.cv:
                self._lingerers.discard(threading.current_thread())
