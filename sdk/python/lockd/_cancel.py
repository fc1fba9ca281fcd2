"""Cancel: a cancellation token for blocking calls (acquire, watch, observe)."""

from __future__ import annotations

import threading


class Cancel:
    """Cancels the calls it is passed to: ``cancel()`` makes them raise
    :class:`lockd.Cancelled` (or end an iteration). Thread-safe; cancelling
    twice is harmless."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._done = False
        self._fns: dict[int, object] = {}
        self._next = 0

    def cancel(self) -> None:
        """Cancels every call this token was passed to, and every later one; runs the on_cancel functions."""
        with self._mu:
            if self._done:
                return
            self._done = True
            fns = list(self._fns.values())
            self._fns.clear()
        for fn in fns:
            fn()

    @property
    def cancelled(self) -> bool:
        with self._mu:
            return self._done

    def on_cancel(self, fn):
        """Calls fn at cancel() (at once if cancelled); returns a function that unregisters it."""
        with self._mu:
            if not self._done:
                i = self._next
                self._next += 1
                self._fns[i] = fn

                def remove():
                    with self._mu:
                        self._fns.pop(i, None)
                return remove
        fn()
        return lambda: None


def link(*cancels):
    """A Cancel cancelled when any of cancels (None skipped) is; returns (cancel, unlink)."""
    c = Cancel()
    removes = [x.on_cancel(c.cancel) for x in cancels if x is not None]

    def unlink():
        for r in removes:
            r()
    return c, unlink
