"""A chaos worker on the Python SDK: the client process of lockd's chaos
suite (test/chaos), speaking exactly the protocol of the Go worker
(test/chaos/worker, package doc; test/chaos/cmd/chaos-worker for the flags),
so that the runner can start it instead of the Go one (runner.Spec.SDK).
Run as ``python3 -m lockd._chaosworker -proc w0 -lockd ADDR ...``; the run's
epoch comes from LOCKD_CHAOS_EPOCH (Unix nanoseconds). Not for use by hand.

The loop, the state lines on stdout (``wait KEY SESSION``, ``hold KEY TOKEN
1 MODE REPLICA``, ``free KEY``), the ``-hold-ack`` handshake (one line read
from stdin after a hold line and the hold, before the grant's second write),
the writes to the fenced resource (POST /write, which refuses a token below
the highest it saw), the history file (JSON lines: start, invoke, complete,
op) and the trust rules (``sdk``: until the lock's ``lost`` is set, or its
deadline passed before the release; ``receive-ttl`` and ``ignore-done``: the
controls) are the Go worker's. Like it, the worker writes regardless of
trust: late writes model a holder paused between checking its lock and
writing, which the fenced resource must refuse and the trusted-overlap
checker must find when the trust rule is broken (LOCKD_PYSDK_CONTROL=recvtime
breaks the SDK's send-time rule, lockd.session).

REPLICA is the address the SDK's connection uses after the grant (pick-first:
the replica it talks to), where the Go worker names the peer of its latest
successful call; they differ only if the connection moved in between.

SIGTERM or SIGINT stops the worker: it finishes the current grant (release
included), closes its session and exits 0; a failure to record exits 1.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.parse

from . import errors
from ._cancel import Cancel
from ._clock import Clock
from .client import Client

EPOCH_ENV = "LOCKD_CHAOS_EPOCH"
TRUST_SDK, TRUST_RECEIVE_TTL, TRUST_IGNORE_DONE = "sdk", "receive-ttl", "ignore-done"
EXCLUSIVE_SHARE = 0.4  # worker.ExclusiveShare
WRITE_TIMEOUT = 5.0
RELEASE_TIMEOUT = 5.0
OPEN_TIMEOUT = 5.0
RETRY_PAUSE = 0.05

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
          "m": 60_000_000_000, "h": 3_600_000_000_000}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(s: str) -> float:
    """A Go time.Duration string ("0s", "80ms", "1m30s") in seconds."""
    if s in ("0", "+0", "-0"):
        return 0.0
    sign, rest = (-1, s[1:]) if s.startswith("-") else (1, s.lstrip("+"))
    pos, ns = 0, 0.0
    while pos < len(rest):
        m = _PART.match(rest, pos)
        if m is None:
            raise ValueError(f"invalid duration {s!r}")
        ns += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not rest:
        raise ValueError(f"invalid duration {s!r}")
    return sign * ns / 1e9


class HistoryClock:
    """history.Clock: nanoseconds since the run's epoch, read from the
    monotonic clock after one reading of the wall clock."""

    def __init__(self, epoch_ns: int):
        self.epoch = epoch_ns
        self.start_mono = time.monotonic_ns()
        self.offset = time.time_ns() - epoch_ns

    def now(self) -> int:
        return self.offset + time.monotonic_ns() - self.start_mono

    def at(self, mono: float) -> int:
        """The history time of a time.monotonic() reading."""
        return self.offset + int(mono * 1e9) - self.start_mono


class Recorder:
    """history.Recorder: one JSON line per event, each one write(2) to a file
    opened O_APPEND|O_EXCL, so a SIGKILL leaves whole lines only."""

    def __init__(self, path: str, proc: str, clock: HistoryClock):
        self.proc, self.clock = proc, clock
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.mu = threading.Lock()
        self.seq = 0
        self.err: str | None = None
        with self.mu:
            self._write({"ev": "start", "proc": proc, "seq": 0, "kind": "", "invoke": clock.now(), "complete": 0,
                         "outcome": "", "epoch": clock.epoch})

    def _write(self, line: dict) -> None:
        if self.err is not None:
            return
        if self.fd < 0:
            self.err = "history: write after close"
            return
        b = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        try:
            if os.write(self.fd, b) != len(b):
                self.err = "history: write line: short write"
        except OSError as e:
            self.err = f"history: write line: {e}"

    def invoke(self, kind: str, key: str, token: int = 0, mode: str = "") -> tuple:
        with self.mu:
            self.seq += 1
            line = {"ev": "invoke", "proc": self.proc, "seq": self.seq, "kind": kind, "key": key,
                    "invoke": self.clock.now(), "complete": 0, "outcome": ""}
            if token:
                line["token"] = token
            if mode:
                line["mode"] = mode
            self._write(line)
            return (self.seq, kind, key)

    def complete(self, call: tuple, outcome: str, token: int = 0, err: str = "") -> None:
        now = self.clock.now()
        seq, kind, key = call
        line = {"ev": "complete", "proc": self.proc, "seq": seq, "kind": kind, "key": key, "invoke": 0,
                "complete": now, "outcome": outcome}
        if token:
            line["token"] = token
        if err:
            line["err"] = err
        with self.mu:
            self._write(line)

    def lost(self, key: str, token: int, at: int, why: str) -> None:
        """A lost op: trust in (key, token) ended at at (or now, if earlier)."""
        now = self.clock.now()
        with self.mu:
            self.seq += 1
            self._write({"ev": "op", "proc": self.proc, "seq": self.seq, "kind": "lost", "key": key, "token": token,
                         "invoke": min(now, at), "complete": now, "outcome": "ok", "err": why})

    def close(self) -> str | None:
        with self.mu:
            if self.fd >= 0:
                try:
                    os.close(self.fd)
                except OSError as e:
                    self.err = self.err or f"history: close recorder: {e}"
                self.fd = -1
            return self.err


class ScaledClock(Clock):
    """An SDK clock running scale times as fast as the real one (the Go
    worker's scaledClock): readings and waits are converted."""

    def __init__(self, scale: float):
        self.base = time.monotonic()
        self.scale = scale

    def now(self) -> float:
        return self.base + (time.monotonic() - self.base) * self.scale

    def wait(self, cond, until) -> None:
        if until is None:
            cond.wait()
            return
        d = (until - self.now()) / self.scale
        if d > 0:
            cond.wait(d)

    def real(self, t: float) -> float:
        return self.base + (t - self.base) / self.scale


class Fenced:
    """The fenced resource's client (package fenced): POST /write."""

    def __init__(self, base: str):
        u = urllib.parse.urlsplit(base)
        self.host, self.port, self.path = u.hostname, u.port or 80, u.path.rstrip("/") + "/write"
        self.conn: http.client.HTTPConnection | None = None

    def write(self, key: str, writer: str, mode: str, token: int) -> tuple[str, str]:
        """(outcome, error text): ok; fail for a stale token or a bad
        request (definite refusals); unknown for anything else."""
        body = {"key": key, "writer": writer, "token": token}
        if mode:
            body["mode"] = mode
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=WRITE_TIMEOUT)
            self.conn.request("POST", self.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return "unknown", f"fenced: write: {e}"
        if resp.status in (200, 409):
            try:
                rep = json.loads(data or b"{}")
            except ValueError as e:
                return "unknown", f"fenced: write: decode reply: {e}"
            if resp.status == 409:
                return "fail", (f"fenced: write {key!r} token {token} (highest {rep.get('highest', 0)}): "
                                "fenced: stale token")
            return "ok", ""
        if resp.status == 400:
            return "fail", f"fenced: write: {data[:512].decode(errors='replace').strip()}: fenced: bad request"
        return "unknown", f"fenced: write: unexpected status {resp.status} {resp.reason}"

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class LostOnce:
    """At most one lost op per grant (the lost callback and the release path may both see the end of trust)."""

    def __init__(self, rec: Recorder):
        self.rec, self.mu, self.done = rec, threading.Lock(), False

    def record(self, key: str, token: int, at: int, why: str) -> None:
        with self.mu:
            if self.done:
                return
            self.done = True
        self.rec.lost(key, token, at, why)


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


class Worker:
    def __init__(self, cfg: dict, rec: Recorder, stop: threading.Event):
        self.cfg, self.rec, self.stop = cfg, rec, stop
        self.cancel = Cancel()
        self.rng = random.Random(cfg["seed"])
        self.fc = Fenced(cfg["fenced"])
        self.clock = ScaledClock(cfg["clock_scale"]) if cfg["clock_scale"] not in (0, 1) else None
        self.c = Client(addresses=cfg["lockd"], backoff=(0.02, 0.5), heartbeat_interval=cfg["heartbeat_interval"],
                        clock=self.clock)
        self.sess = None
        self.next = ""

    def real(self, t: float) -> int:
        """The history time of a reading of the SDK's clock."""
        return self.rec.clock.at(self.clock.real(t) if self.clock else t)

    def drop_session(self) -> None:
        if self.sess is not None:
            self.sess._close_quietly(1.0)  # best effort: an expired one is abandoned by the SDK anyway
            self.sess = None

    def session(self, key: str):
        if self.sess is not None and self.sess.error is None:
            return self.sess
        self.drop_session()
        call = self.rec.invoke("open", key)
        try:
            s = self.c.session(ttl=self.cfg["ttl"], timeout=OPEN_TIMEOUT)
        except errors.LockdError as e:
            self.rec.complete(call, "unknown", err=str(e))  # the server may have made a session nobody uses
            self.stop.wait(RETRY_PAUSE)
            return None
        self.rec.complete(call, "ok")
        self.sess = s
        return s

    def grant_mode(self) -> tuple[str, dict]:
        if self.cfg["limit"] > 1:
            return "slot", {"limit": self.cfg["limit"]}
        if self.cfg["rw"] and self.rng.random() < EXCLUSIVE_SHARE:
            return "exclusive", {"exclusive": True}
        if self.cfg["rw"]:
            return "shared", {"shared": True}
        return "", {}

    def write(self, key: str, mode: str, token: int) -> None:
        call = self.rec.invoke("write", key, token, mode)
        outcome, err = self.fc.write(key, self.cfg["proc"], mode, token)
        self.rec.complete(call, outcome, err=err)

    def iteration(self) -> None:
        cfg = self.cfg
        if not self.next:
            self.next = cfg["keys"][self.rng.randrange(len(cfg["keys"]))]
        key = self.next
        sess = self.session(key)
        if sess is None:
            return
        self.next = ""
        mode, opts = self.grant_mode()
        say(f"wait {key} {sess.id}")
        call = self.rec.invoke("acquire", key, 0, mode)
        try:
            lock = sess.acquire(key, cancel=self.cancel, **opts)
        except errors.LockdError as e:
            definite = isinstance(e, (errors.InvalidArgument, errors.LimitMismatch))
            self.rec.complete(call, "fail" if definite else "unknown", err=str(e))
            say(f"free {key}")
            self.stop.wait(RETRY_PAUSE)
            return
        recv = time.monotonic()
        tok = lock.token
        self.rec.complete(call, "ok", tok)

        lost = LostOnce(self.rec)
        if cfg["trust"] == TRUST_SDK:
            def on_lost(err):
                if not isinstance(err, errors.Released):
                    lost.record(key, tok, self.real(lock.deadline), f"lost set: {err}")
            lock.on_lost(on_lost)

        self.write(key, mode, tok)
        hold = cfg["hold_min"]
        if cfg["hold_max"] > cfg["hold_min"]:
            hold += self.rng.randint(0, round((cfg["hold_max"] - cfg["hold_min"]) * 1e9)) / 1e9
        try:
            addr = self.c.conn.pick()[0]
        except errors.Closed:
            addr = "-"
        say(f"hold {key} {tok} 1 {mode or 'plain'} {addr}")
        time.sleep(hold)  # the critical section: not cut short by a stop
        if cfg["hold_ack"]:
            sys.stdin.buffer.readline()  # EOF (the harness is gone) lets the worker go on
        if cfg["trust"] == TRUST_RECEIVE_TTL:
            end = recv + sess.ttl
            trust_end = self.rec.clock.at(end)
            if time.monotonic() >= end:
                lost.record(key, tok, trust_end, "control: a full TTL since the grant arrived")
        elif cfg["trust"] == TRUST_IGNORE_DONE:
            trust_end = None  # never before the release
        else:
            trust_end = self.real(lock.deadline)
        self.write(key, mode, tok)

        # A deadline that passed before the release ends trust even if the
        # SDK's timer has not fired yet (the process was stopped or starved).
        rel_at = self.rec.clock.now()
        if trust_end is not None and trust_end < rel_at:
            lost.record(key, tok, trust_end, "deadline passed before the release (lost not set yet)")
        call = self.rec.invoke("release", key, tok)
        err = None
        try:
            lock.release(timeout=RELEASE_TIMEOUT)
            outcome = "ok"
        except (errors.NotOwner, errors.InvalidArgument) as e:
            outcome, err = "fail", e
        except errors.LockdError as e:
            outcome, err = "unknown", e
        self.rec.complete(call, outcome, err=str(err) if err else "")
        if outcome == "fail":
            # Refused: the grant is not this session's current one (or soon
            # will not be); without this the history would show it held forever.
            lost.record(key, tok, rel_at, f"release refused: {err}")
        say(f"free {key}")

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.rec.err is None:
                self.iteration()
        finally:
            self.drop_session()
            self.c.close()
            self.fc.close()


def parse_args(argv: list[str]) -> dict:
    """The Go worker's flags (-name value, -name=value; -hold-ack and -rw alone are true)."""
    cfg = {"proc": "", "lockd": "", "fenced": "", "history": "", "keys": "", "ttl": "0s", "hold-min": "0s",
           "hold-max": "0s", "clock-scale": "1", "trust": TRUST_SDK, "limit": "0", "rw": "false",
           "heartbeat-interval": "0s", "seed": "1", "hold-ack": "false", "pairs": "false"}
    boolean = {"rw", "hold-ack", "pairs"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a in ("-", "--"):
            raise ValueError(f"unexpected argument {a!r}")
        name, eq, val = a.lstrip("-").partition("=")
        if name not in cfg:
            raise ValueError(f"flag provided but not defined: -{name}")
        if not eq:
            if name in boolean:
                val = "true"
            else:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"flag needs an argument: -{name}")
                val = argv[i]
        cfg[name] = val
        i += 1

    def boolean_of(name):
        v = cfg[name].lower()
        if v not in ("true", "false", "1", "0", "t", "f"):
            raise ValueError(f"-{name}={cfg[name]}: not a boolean")
        return v in ("true", "1", "t")

    out = {
        "proc": cfg["proc"], "fenced": cfg["fenced"], "history": cfg["history"], "trust": cfg["trust"],
        "lockd": [a.strip() for a in cfg["lockd"].split(",") if a.strip()],
        "keys": [k.strip() for k in cfg["keys"].split(",") if k.strip()],
        "ttl": parse_duration(cfg["ttl"]), "hold_min": parse_duration(cfg["hold-min"]),
        "hold_max": parse_duration(cfg["hold-max"]), "clock_scale": float(cfg["clock-scale"]),
        "limit": int(cfg["limit"]), "rw": boolean_of("rw"), "hold_ack": boolean_of("hold-ack"),
        "heartbeat_interval": parse_duration(cfg["heartbeat-interval"]), "seed": int(cfg["seed"]),
    }
    problems = []
    if not out["proc"]:
        problems.append("proc is required")
    if not out["lockd"]:
        problems.append("at least one lockd address is required")
    if not out["fenced"] or not out["history"]:
        problems.append("fenced url and history path are required")
    if not out["keys"]:
        problems.append("at least one key is required")
    if out["hold_min"] < 0 or out["hold_max"] < out["hold_min"]:
        problems.append(f"hold bounds {cfg['hold-min']}..{cfg['hold-max']}: want 0 <= min <= max")
    if out["clock_scale"] < 0:
        problems.append(f"clock scale {out['clock_scale']} is negative")
    if out["trust"] not in (TRUST_SDK, TRUST_RECEIVE_TTL, TRUST_IGNORE_DONE):
        problems.append(f"trust {out['trust']!r}: want sdk, receive-ttl or ignore-done")
    if not 0 <= out["limit"] <= 1024:
        problems.append(f"limit {out['limit']}: want 0..1024")
    if out["rw"] and out["limit"] > 1:
        problems.append(f"limit {out['limit']} with rw: a key is a semaphore or a read/write lock")
    if boolean_of("pairs"):  # the runner passes -pairs=false to every worker (issue 26)
        problems.append("pairs: pair workers (the deadlock scenarios) are the Go worker's only")
    if problems:
        raise ValueError("config: " + "; ".join(problems))
    return out


def main(argv: list[str]) -> int:
    try:
        cfg = parse_args(argv)
        epoch = int(os.environ[EPOCH_ENV])
    except KeyError:
        print(f"chaos-worker: {EPOCH_ENV} not set", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"chaos-worker: {e}", file=sys.stderr)
        return 2
    # The signals are taken by the main thread with sigwait; every thread
    # started from here on inherits the mask.
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        rec = Recorder(cfg["history"], cfg["proc"], HistoryClock(epoch))
    except OSError as e:
        print(f"chaos-worker: history: create recorder: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    failed: list[BaseException] = []
    try:
        w = Worker(cfg, rec, stop)
    except errors.LockdError as e:
        rec.close()
        print(f"chaos-worker: {e}", file=sys.stderr)
        return 1

    def run():
        try:
            w.run()
        except BaseException as e:  # reported below: the worker must not die silently
            failed.append(e)
        finally:
            stop.set()
    t = threading.Thread(target=run, name="chaos-worker")
    t.start()
    while t.is_alive():
        got = signal.sigtimedwait(sigs, 0.2)
        # Checked: when its timeout ran out while the process was stopped
        # (SIGSTOP, SIGCONT), sigtimedwait returns a siginfo of garbage,
        # not None.
        if got is not None and got.si_signo in sigs:
            stop.set()
            w.cancel.cancel()  # ends a waiting acquire; a held grant is finished properly
            break
    t.join()
    err = rec.close()
    if failed:
        print(f"chaos-worker: {failed[0]!r}", file=sys.stderr)
        return 1
    if err:
        print(f"chaos-worker: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
