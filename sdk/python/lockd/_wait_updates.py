"""Waiting updates (docs/contracts/C2.md #ct2-wait-updates): an Acquire is one
unary call, so ``acquire(..., on_wait_update=fn)`` reads the key's queue with
Inspect while it waits and calls fn when what it reads changes."""

from __future__ import annotations

import contextvars
import logging
import threading
from dataclasses import dataclass

from . import errors
from ._cancel import Cancel
from ._types import LockInfo, lock_info
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

DEFAULT_EVERY = 1.0  # seconds between reads when wait_update_every is not given
MIN_EVERY = 0.1  # the least wait_update_every
FIRST_READ = 0.3  # the first read comes this long after acquire starts (or every, if shorter)


@dataclass(frozen=True)
class WaitUpdate:
    """What ``acquire(..., on_wait_update=fn)`` reports about its wait
    (C2 #ct2-wait-updates). ``position`` is the session's place in the
    key's queue, 1 = next in line, 0 when the read did not show it waiting
    (not queued yet, or the key being handed over); ``waiters`` the queue's
    length; ``estimate`` the server's estimate of the wait in seconds, None
    while it knows none (never a promise); ``info`` the Inspect answer the
    update comes from. When the read failed, ``error`` is set and the
    figures are empty: :class:`lockd.PermissionDenied` once (the caller may
    not read the key) and no more updates; any other error, and the reads go
    on."""
    key: str
    position: int = 0
    waiters: int = 0
    estimate: float | None = None
    info: LockInfo | None = None
    error: errors.LockdError | None = None


def check_every(every: float | None) -> float:
    if every is None or every == 0:
        return DEFAULT_EVERY
    if every < MIN_EVERY:
        raise errors.InvalidArgument(f"wait_update_every: {every} s, at least {MIN_EVERY} s",
                                     field="wait_update_every")
    return float(every)


def _key(u: WaitUpdate):
    """What a change is judged by: position, queue length, estimate (ms),
    holder (token), failed or not."""
    est = None if u.estimate is None else round(u.estimate * 1000)
    info = u.info
    return (u.position, u.waiters, est, info is not None and info.held, info.token if info else 0, u.error is None)


class Updates:
    """The reads of one acquire: a thread that acquire starts and, with
    stop(), ends and joins before it returns."""

    def __init__(self, session, key: str, every: float, fn):
        self._s, self._key, self._every, self._fn = session, key, every, fn
        self._stop = Cancel()
        self._last = None
        # In the caller's context: the reads are the acquire's, children of
        # its caller's span when traced (C4 #ct4-traces).
        ctx = contextvars.copy_context()
        self._t = threading.Thread(target=ctx.run, args=(self._run,), name="lockd-wait-updates", daemon=True)
        self._t.start()

    def stop(self) -> None:
        """Ends the reads (a read in flight is cancelled) and waits for the
        thread: fn is not called after stop returns."""
        self._stop.cancel()
        if self._t is not threading.current_thread():
            self._t.join()

    def _run(self) -> None:
        c = self._s.c
        d = min(FIRST_READ, self._every)
        while c._sleep(d, self._stop):
            sent = c.clock.now()
            if not self._read():
                return
            d = max(0.0, self._every - (c.clock.now() - sent))

    def _read(self) -> bool:
        """One read; False when no more should follow."""
        c, me = self._s.c, self._s.id
        try:
            resp, _ = c._call("Inspect", pb.InspectRequest(key=self._key), timeout=max(self._every, 1.0),
                              cancel=self._stop)
            err = None
        except (errors.Cancelled, errors.Closed):
            return False
        except errors.LockdError as e:
            resp, err = None, e
        if self._stop.cancelled:
            return False
        if err is not None:
            u = WaitUpdate(key=self._key, error=err)
        else:
            info = lock_info(resp.lock) if resp.held else LockInfo(key=self._key)
            if info.held and (info.session == me or any(h.session == me for h in info.holders)):
                return True  # granted: the reply is on its way
            pos = info.waiters.index(me) + 1 if me in info.waiters else 0
            est = next((e.wait for e in info.wait_estimates if e.session == me), None)
            u = WaitUpdate(key=self._key, position=pos, waiters=len(info.waiters), estimate=est, info=info)
        if self._last is None or _key(self._last) != _key(u):
            self._last = u
            try:
                self._fn(u)
            except Exception as e:  # the caller's; it ends the updates, never the acquire
                log.debug("on_wait_update raised, no more wait updates for %r: %r", self._key, e)
                return False
        return not isinstance(err, errors.PermissionDenied)
