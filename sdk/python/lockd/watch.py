"""Watch: the changes to a key prefix, resumed after a break
(docs/contracts/C2.md #ct2-watch-resume, #ct2-watch-progress)."""

from __future__ import annotations

import logging

import grpc

from . import errors
from ._cancel import Cancel
from ._types import Event, EventKind
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

CURSOR_HEADER = "lockd-watch-cursor"
MIN_SILENCE = 1.0


class Watch:
    """An iterator of :class:`lockd.Event`, in commit order. When the stream
    breaks (its replica died, drained or went silent) it is re-opened,
    through any address, right after the last event returned: on etcd every
    later event comes exactly once; where the server cannot tell what
    happened meanwhile (PostgreSQL, compacted etcd history) an
    ``EventKind.RESYNC`` event comes first. Iteration ends when ``cancel``
    fires or close() is called; it raises when the watch cannot go on.
    Progress messages never reach the iterator. A context manager."""

    def __init__(self, c, prefix: str, holders: bool, cancel: Cancel | None):
        self.c = c
        self.prefix = prefix
        self.holders = holders
        self.cursor = ""
        self._cancel = Cancel()
        self._unlink = cancel.on_cancel(self._cancel.cancel) if cancel is not None else (lambda: None)
        self._call = None
        self._addr = ""
        self._first = None
        self._bound = 0.0
        self._silent = False
        self._resync = False

    @classmethod
    def _open(cls, c, prefix: str, holders: bool, cancel: Cancel | None, timeout) -> "Watch":
        if len(prefix.encode()) > 512 or "\x00" in prefix:
            raise errors.InvalidArgument("prefix: at most 512 bytes, no NUL byte", field="prefix")
        w = cls(c, prefix, holders, cancel)
        w._connect(timeout)
        return w

    def __repr__(self) -> str:
        return f"lockd.Watch({self.prefix!r})"

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        return self

    def close(self) -> None:
        """Ends the watch; iteration stops."""
        self._cancel.cancel()
        self._unlink()

    def _connect(self, timeout) -> None:
        """Opens a stream from the cursor, retrying until established, timeout, cancel or a refusal."""
        c = self.c
        resume = self.cursor
        until = None if timeout is None else c.clock.now() + (c.call_timeout if timeout == -1.0 else timeout)
        attempt = 0
        last = None
        while True:
            if self._cancel.cancelled:
                raise StopIteration
            addr, stub = c.conn.pick()
            call = stub.Watch(pb.WatchRequest(prefix=self.prefix, holder=self.holders, resume_after=resume,
                                              progress=True), metadata=c.conn.metadata)
            undo = self._cancel.on_cancel(call.cancel)
            timer = c.timers.at(c.clock.now() + self._bound, lambda: self._on_silent(call)) \
                if self._bound and c.conn.several else None
            err = None
            try:
                md = call.initial_metadata()
                first = None
                if not md:
                    first = next(call)  # no headers: the status (or an event of an old server) says why
                self._first = first
            except grpc.RpcError as e:
                err = errors.from_rpc(e)
            except StopIteration:
                err = errors.Unavailable("watch ended before it was established")
            finally:
                if timer is not None:
                    timer.cancel()
            if err is None:
                log.debug("watch %r established on %s", self.prefix, addr)
                self._call, self._addr, self._undo = call, addr, undo
                start = dict(md or ()).get(CURSOR_HEADER, "")
                if not resume:
                    self.cursor = start
                elif not start:
                    self.cursor, self._resync = "", True
                return
            undo()
            if self._cancel.cancelled:
                raise StopIteration
            if self._silent:
                err, self._silent = errors.Unavailable("watch stream silent (its replica stalled)"), False
            if not err.retryable:
                raise err
            c.conn.after_error(addr, err)
            last = err
            if until is not None and c.clock.now() >= until:
                raise last
            if not c._sleep(c._backoff(attempt), self._cancel):
                raise StopIteration
            attempt += 1

    def _on_silent(self, call) -> None:
        """A stream silent for its bound: set its replica aside and end it (several addresses only)."""
        if self.c.conn.set_aside(self._addr or "", draining=False):
            self._silent = True
            call.cancel()

    def __next__(self) -> Event:
        c = self.c
        while True:
            if self._resync:
                self._resync = False
                return Event(kind=EventKind.RESYNC)
            if self._cancel.cancelled:
                raise StopIteration
            timer = None
            if self._bound and c.conn.several:
                call = self._call
                timer = c.timers.at(c.clock.now() + self._bound, lambda: self._on_silent(call))
            try:
                if self._first is not None:
                    r, self._first = self._first, None
                else:
                    r = next(self._call)
            except (grpc.RpcError, StopIteration) as e:
                if self._cancel.cancelled:
                    raise StopIteration from None
                err = errors.from_rpc(e) if isinstance(e, grpc.RpcError) else errors.Unavailable("watch ended")
                if self._silent:
                    err, self._silent = errors.Unavailable("watch stream silent (its replica stalled)"), False
                if err.retryable and self.cursor:
                    log.debug("watch resuming: %s", err)
                    self._undo()
                    if isinstance(err, errors.ShuttingDown):
                        c.conn.set_aside(self._addr, draining=True)
                    self._connect(None)
                    continue
                raise err from None
            finally:
                if timer is not None:
                    timer.cancel()
            if r.kind == pb.EVENT_KIND_PROGRESS:
                if r.cursor:
                    self.cursor = r.cursor
                if r.progress_interval_ms > 0:
                    self._bound = max(3 * r.progress_interval_ms / 1000.0, MIN_SILENCE)
                continue
            if r.cursor:
                self.cursor = r.cursor
            return Event(kind=EventKind(r.kind), key=r.key, session=r.session_id, token=r.token, owner=r.owner,
                         labels=dict(r.labels), value=bytes(r.value), cursor=r.cursor)
