"""The SDK's clock: a monotonic clock and waits on it, replaceable by a fake
clock in tests (docs/contracts/C2.md #ct2-sdk: the timing rules are shown
with a fake clock).

Every timed wait of the SDK is ``clock.wait(cond, until)`` with ``cond``
held: it returns when ``cond`` is notified or the clock reached ``until``
(``None``: no bound). Callers re-check their own state in a loop.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time


class Clock:
    """The real clock: time.monotonic()."""

    def now(self) -> float:
        """The monotonic time, in seconds."""
        return time.monotonic()

    def wait(self, cond: threading.Condition, until: float | None) -> None:
        """Waits on cond (held) until it is notified or the clock reaches until (None: no bound)."""
        if until is None:
            cond.wait()
            return
        d = until - time.monotonic()
        if d > 0:
            cond.wait(d)


class FakeClock(Clock):
    """A clock that moves only when advance() is called (tests)."""

    def __init__(self, start: float = 1000.0):
        self._mu = threading.Lock()
        self._t = start
        self._waits: dict[int, tuple[threading.Condition, float | None]] = {}
        self._ids = itertools.count()
        self._timers: dict[int, tuple[float, object]] = {}  # lockd.aio's timers: id -> (when, wake)

    def now(self) -> float:
        """The fake time: it moves only by advance()."""
        with self._mu:
            return self._t

    def advance(self, d: float) -> None:
        """Moves the fake time on by d seconds and wakes every wait and timer to check it."""
        with self._mu:
            self._t += d
            conds = {id(c): c for c, _ in self._waits.values()}
            wakes = [w for _, w in self._timers.values()]
        for c in conds.values():
            with c:
                c.notify_all()
        for w in wakes:
            w()

    def pending(self, lo: float, hi: float) -> bool:
        """Whether some wait ends in [lo, hi] (a timer armed there)."""
        with self._mu:
            return (any(u is not None and lo <= u <= hi for _, u in self._waits.values())
                    or any(lo <= u <= hi for u, _ in self._timers.values()))

    def add_timer(self, when: float, wake) -> int:
        """Registers an instant lockd.aio waits for: wake() (thread-safe) runs
        at every advance() until remove_timer; pending() sees it."""
        with self._mu:
            tid = next(self._ids)
            self._timers[tid] = (when, wake)
            return tid

    def remove_timer(self, tid: int) -> None:
        """Unregisters the instant add_timer registered as tid."""
        with self._mu:
            self._timers.pop(tid, None)

    def wait(self, cond: threading.Condition, until: float | None) -> None:
        """Waits on cond (held) until it is notified or advance() reaches until (None: no bound)."""
        wid = next(self._ids)
        with self._mu:
            if until is not None and self._t >= until:
                return
            self._waits[wid] = (cond, until)
        try:
            # advance() notifies cond after moving the clock; it takes cond
            # first, so a notify between the check above and this wait is
            # not lost (the caller holds cond).
            cond.wait(1.0)
        finally:
            with self._mu:
                self._waits.pop(wid, None)


class Timers:
    """One thread that runs functions at instants of a clock (the SDK's
    deadline timers). Owned by a Client: stop() ends and joins it."""

    def __init__(self, clock: Clock, name: str = "lockd-timers"):
        self.clock = clock
        self._cv = threading.Condition()
        self._heap: list = []
        self._seq = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def at(self, when: float, fn) -> "Timer":
        t = Timer(self, when, fn)
        with self._cv:
            heapq.heappush(self._heap, (when, next(self._seq), t))
            self._cv.notify_all()
        return t

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stopped:
                        return
                    now = self.clock.now()
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if self._heap and self._heap[0][0] <= now:
                        _, _, t = heapq.heappop(self._heap)
                        break
                    self.clock.wait(self._cv, self._heap[0][0] if self._heap else None)
            if not t.cancelled:
                try:
                    t.fn()
                except Exception:  # a timer function must not kill the thread
                    import logging
                    logging.getLogger("lockd").exception("timer function failed")

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()


class Timer:
    def __init__(self, timers: Timers, when: float, fn):
        self.timers, self.when, self.fn = timers, when, fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
