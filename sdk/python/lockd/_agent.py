"""A JSON-lines agent: drives the SDK from another process (test/parity
runs its scenarios through it; `python3 -m lockd._agent`).

Protocol (one JSON object per line; stdin requests, stdout replies and
notices; stderr is free text):

- request: ``{"id": N, "op": OP, ...arguments}``; ``id`` is the caller's,
  unique, non-zero. Every request runs on a thread of its own, so a waiting
  acquire does not hold up the next request; replies may come out of order.
- reply: ``{"id": N, "ok": true, ...results}`` or ``{"id": N, "ok": false,
  "error": NAME, "reason": WIRE_REASON, "message": TEXT}``. NAME is the Go
  SDK's sentinel name for the exception class (``ErrLocked``,
  ``ErrWaitTimeout``, ``ErrLockLost`` ...; ``context.Canceled`` for a
  cancelled call), so outcome strings compare across SDKs. An
  ``ErrDeadlock`` reply also carries ``keys``, the cycle's keys.
- notice (no ``id``): ``{"event": "lost", "lock": H, "error": NAME}`` when a
  lock's trust ends (not for a release); ``{"event": "watch", "watch": H,
  "kind": "acquired", "key", "session", "token", "owner", "labels", "value"}`` per
  watch event (``"error"`` set on the last one when it broke);
  ``{"event": "observe", "observer": H, "leader": bool, "session", "token", "owner",
  "value"}`` per observation.

Objects are named by handles the replies return (``c1``, ``s1``, ``l1``,
``w1``, ``o1``). Ops and their arguments (durations in seconds):

  client {addresses: [..], ttl?, safety_margin?, heartbeat_interval?,
          ca_file?, cert_file?, key_file?, token_file?}   -> {client}
  session {client, ttl?, owner?, labels?, lock_delay?}    -> {session, session_id}
  acquire {session, key, timeout?, value?, limit?, mode?: "shared"|"exclusive",
           lock_delay?, max_hold?, no_deadlock_check?}    -> {lock, token}
  try_acquire {same, no timeout, no no_deadlock_check}    -> {lock, token}
  acquire_all {session, keys: [..], timeout?, no_deadlock_check?}
                                                          -> {locks: [{lock, key, token}]}
  try_acquire_all {session, keys: [..]}                   -> {locks: [{lock, key, token}]}
  campaign {session, name, value, timeout?}               -> {lock, token}
  cancel {call}: cancels the waiting acquire/campaign of request id call -> {}
  release {lock} | set_value {lock, value} | proclaim {lock, value}  -> {}
  lock_state {lock}       -> {valid, error, token, deadline_in}
  session_state {session} -> {valid, error, deadline_in}
  close_session {session} -> {}
  inspect {client, key}   -> {held, session, token, waiters, owner, labels, value, limit, holders,
                              lock_delay, delay_remaining}
  list {client, prefix}   -> {keys, locks: [{key, session, token, owner, value}]}
  revoke {client, key}    -> {held, session, token}
  check {client, key, token, cached?} -> {current, tokens, cached}
  watch {client, prefix, holders?} -> {watch}; stop_watch {watch} -> {}
  observe {client, name}  -> {observer}; stop_observe {observer} -> {}
  close_client {client}   -> {}
  quit                    -> {} and the agent exits (closing every client)

Values travel as text (UTF-8). The agent exits at end of input too.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading

from . import errors
from ._cancel import Cancel
from ._conn import TLS
from .client import Client

# The Go SDK's sentinel names, most specific class first.
_NAMES = [
    (errors.LimitMismatch, "ErrLimitMismatch"), (errors.InvalidArgument, "ErrInvalidArgument"),
    (errors.SessionExpired, "ErrSessionExpired"), (errors.SessionDead, "ErrSessionDead"),
    (errors.NotOwner, "ErrNotOwner"), (errors.Locked, "ErrLocked"), (errors.WaitTimeout, "ErrWaitTimeout"),
    (errors.Deadlock, "ErrDeadlock"), (errors.MaxHold, "ErrMaxHold"), (errors.LockLost, "ErrLockLost"), (errors.Released, "ErrReleased"),
    (errors.Closed, "ErrClosed"), (errors.LimitReached, "ErrLimit"), (errors.Internal, "ErrInternal"),
    (errors.Unavailable, "ErrUnavailable"), (errors.PermissionDenied, "ErrPermissionDenied"),
    (errors.Cancelled, "context.Canceled"), (errors.DeadlineExceeded, "context.DeadlineExceeded"),
]


def err_name(e) -> str:
    if e is None:
        return "ok"
    for cls, name in _NAMES:
        if isinstance(e, cls):
            return name
    return f"unexpected({type(e).__name__})"


class Agent:
    def __init__(self, out=sys.stdout):
        self.out = out
        self.mu = threading.Lock()
        self.objs: dict[str, object] = {}
        self.calls: dict[int, Cancel] = {}
        self.n = itertools.count(1)
        self.threads: list[threading.Thread] = []

    def send(self, msg: dict) -> None:
        line = json.dumps(msg, separators=(",", ":"))
        with self.mu:
            self.out.write(line + "\n")
            self.out.flush()

    def put(self, kind: str, obj) -> str:
        h = f"{kind}{next(self.n)}"
        with self.mu:
            self.objs[h] = obj
        return h

    def get(self, h: str):
        with self.mu:
            obj = self.objs.get(h)
        if obj is None:
            raise errors.InvalidArgument(f"no object {h!r}")
        return obj

    def serve(self, lines) -> None:
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                req = json.loads(line)
            except ValueError as e:
                self.send({"id": 0, "ok": False, "error": "bad-request", "message": str(e)})
                continue
            if req.get("op") == "quit":
                self.send({"id": req.get("id", 0), "ok": True})
                break
            t = threading.Thread(target=self.handle, args=(req,), daemon=True)
            self.threads.append(t)
            t.start()
        self.close()

    def close(self) -> None:
        with self.mu:
            clients = [o for o in self.objs.values() if isinstance(o, Client)]
            cancels = list(self.calls.values())
        for c in cancels:
            c.cancel()
        for c in clients:
            c.close()
        for t in self.threads:
            t.join(timeout=30)

    def handle(self, req: dict) -> None:
        rid = req.get("id", 0)
        try:
            fn = getattr(self, "op_" + str(req.get("op")), None)
            if fn is None:
                raise errors.InvalidArgument(f"unknown op {req.get('op')!r}")
            res = fn(rid, req) or {}
            self.send({"id": rid, "ok": True, **res})
        except errors.LockdError as e:
            msg = {"id": rid, "ok": False, "error": err_name(e), "reason": e.reason, "message": str(e)}
            if isinstance(e, errors.Deadlock):
                msg["keys"] = e.keys
            self.send(msg)
        except Exception as e:  # a bug of the agent or a bad request: say so, keep serving
            self.send({"id": rid, "ok": False, "error": f"unexpected({type(e).__name__})", "message": str(e)})

    # --- ops ------------------------------------------------------------

    def op_client(self, rid, r):
        tls = None
        if r.get("ca_file"):
            tls = TLS(r["ca_file"], r.get("cert_file"), r.get("key_file"))
        c = Client(addresses=r["addresses"], tls=tls, token_file=r.get("token_file"), ttl=r.get("ttl", 0),
                   safety_margin=r.get("safety_margin", 0), heartbeat_interval=r.get("heartbeat_interval", 0),
                   backoff=(0.01, 0.2))
        return {"client": self.put("c", c)}

    def op_session(self, rid, r):
        s = self.get(r["client"]).session(ttl=r.get("ttl", 0), owner=r.get("owner", ""), labels=r.get("labels"),
                                          lock_delay=r.get("lock_delay", 0))
        return {"session": self.put("s", s), "session_id": s.id}

    def _lock(self, l):
        h = self.put("l", l)

        def lost(err):
            if not isinstance(err, errors.Released):
                self.send({"event": "lost", "lock": h, "error": err_name(err)})
        l.on_lost(lost)
        return {"lock": h, "token": l.token}

    def _waiting(self, rid, fn):
        cancel = Cancel()
        with self.mu:
            self.calls[rid] = cancel
        try:
            return fn(cancel)
        finally:
            with self.mu:
                self.calls.pop(rid, None)

    @staticmethod
    def _kw(r):
        return dict(value=r.get("value", "").encode(), limit=r.get("limit", 0), shared=r.get("mode") == "shared",
                    exclusive=r.get("mode") == "exclusive", lock_delay=r.get("lock_delay"),
                    max_hold=r.get("max_hold"))

    def op_acquire(self, rid, r):
        s = self.get(r["session"])
        return self._lock(self._waiting(rid, lambda c: s.acquire(
            r["key"], r.get("timeout"), c, no_deadlock_check=r.get("no_deadlock_check", False), **self._kw(r))))

    def op_try_acquire(self, rid, r):
        return self._lock(self.get(r["session"]).try_acquire(r["key"], **self._kw(r)))

    def _locks(self, ls):
        return {"locks": [{"key": l.key, **self._lock(l)} for l in ls]}

    def op_acquire_all(self, rid, r):
        s = self.get(r["session"])
        return self._locks(self._waiting(rid, lambda c: s.acquire_all(
            r["keys"], r.get("timeout"), c, no_deadlock_check=r.get("no_deadlock_check", False))))

    def op_try_acquire_all(self, rid, r):
        return self._locks(self.get(r["session"]).try_acquire_all(r["keys"]))

    def op_campaign(self, rid, r):
        s = self.get(r["session"])
        lead = self._waiting(rid, lambda c: s.campaign(r["name"], r.get("value", "").encode(), r.get("timeout"), c))
        res = self._lock(lead.lock)
        with self.mu:
            self.objs[res["lock"]] = lead
        return res

    def op_cancel(self, rid, r):
        with self.mu:
            c = self.calls.get(r["call"])
        if c is not None:
            c.cancel()

    def op_release(self, rid, r):
        o = self.get(r["lock"])
        (o.resign if hasattr(o, "resign") else o.release)()

    def op_set_value(self, rid, r):
        self.get(r["lock"]).set_value(r.get("value", "").encode())

    def op_proclaim(self, rid, r):
        self.get(r["lock"]).proclaim(r.get("value", "").encode())

    def op_lock_state(self, rid, r):
        o = self.get(r["lock"])
        l = getattr(o, "lock", o)
        return {"valid": l.valid(), "error": err_name(l.error), "token": l.token,
                "deadline_in": l.deadline - l.session.c.clock.now()}

    def op_session_state(self, rid, r):
        s = self.get(r["session"])
        return {"valid": s.valid(), "error": err_name(s.error), "deadline_in": s.deadline - s.c.clock.now()}

    def op_close_session(self, rid, r):
        self.get(r["session"]).close()

    def op_inspect(self, rid, r):
        i = self.get(r["client"]).inspect(r["key"])
        return {"held": i.held, "session": i.session, "token": i.token, "waiters": i.waiters, "owner": i.owner,
                "labels": i.labels, "value": i.value.decode("utf-8", "replace"), "limit": i.limit,
                "holders": [{"session": h.session, "token": h.token, "mode": h.mode} for h in i.holders],
                "lock_delay": i.lock_delay, "delay_remaining": i.delay_remaining}

    def op_list(self, rid, r):
        infos, _ = self.get(r["client"]).list(r.get("prefix", ""))
        return {"keys": [i.key for i in infos], "locks": [
            {"key": i.key, "session": i.session, "token": i.token, "owner": i.owner,
             "value": i.value.decode("utf-8", "replace")} for i in infos]}

    def op_revoke(self, rid, r):
        i = self.get(r["client"]).revoke(r["key"])
        return {"held": i.held, "session": i.session, "token": i.token}

    def op_check(self, rid, r):
        tc = self.get(r["client"]).check_token(r["key"], r["token"], cached=r.get("cached", False))
        return {"current": tc.current, "tokens": list(tc.tokens), "cached": tc.cached}

    def _pump(self, h, it, render):
        def run():
            try:
                for x in it:
                    self.send(render(x))
            except errors.LockdError as e:
                self.send({**render(None), "error": err_name(e)})
        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()

    def op_watch(self, rid, r):
        w = self.get(r["client"]).watch(r.get("prefix", ""), holders=r.get("holders", False))
        h = self.put("w", w)
        self._pump(h, w, lambda ev: {"event": "watch", "watch": h} if ev is None else {
            "event": "watch", "watch": h, "kind": str(ev.kind), "key": ev.key, "session": ev.session,
            "token": ev.token, "owner": ev.owner, "labels": ev.labels, "value": ev.value.decode("utf-8", "replace")})
        return {"watch": h}

    def op_stop_watch(self, rid, r):
        self.get(r["watch"]).close()

    def op_observe(self, rid, r):
        o = self.get(r["client"]).observe(r["name"])
        h = self.put("o", o)
        self._pump(h, o, lambda x: {"event": "observe", "observer": h} if x is None else {
            "event": "observe", "observer": h, "leader": x.leader, "session": x.session, "token": x.token,
            "owner": x.owner,
            "value": x.value.decode("utf-8", "replace")})
        return {"observer": h}

    def op_stop_observe(self, rid, r):
        self.get(r["observer"]).close()

    def op_close_client(self, rid, r):
        self.get(r["client"]).close()


def main() -> None:
    Agent().serve(sys.stdin)


if __name__ == "__main__":
    main()
