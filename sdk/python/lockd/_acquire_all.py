"""Several locks at once, all or none (docs/contracts/C2.md #ct2-acquire-all):
the Session methods acquire_all and try_acquire_all, one Acquire call with
every key (the Go SDK's acquire_all.go)."""

from __future__ import annotations

import logging
import math

from . import errors
from ._cancel import Cancel
from .client import CLOSE_TIMEOUT, validate_key
from .lock import Lock
from .v1 import lockd_pb2 as pb

log = logging.getLogger("lockd")

MAX_ACQUIRE_KEYS = 64  # wirelimits.MaxAcquireKeys


def _check_keys(keys) -> list[str]:
    if isinstance(keys, str):
        raise errors.InvalidArgument("keys: a list of keys, not one str", field="keys")
    keys = list(keys)
    if not 1 <= len(keys) <= MAX_ACQUIRE_KEYS:
        raise errors.InvalidArgument(f"keys: {len(keys)} keys, want 1..{MAX_ACQUIRE_KEYS}", field="keys")
    for k in keys:
        validate_key(k, field="keys")
    if len(set(keys)) != len(keys):
        raise errors.InvalidArgument("keys: a key is named twice", field="keys")
    return keys


class AcquireAllMixin:
    """Session's calls taking several keys at once."""

    def acquire_all(self, keys, timeout: float | None = None, cancel: Cancel | None = None,
                    no_deadlock_check: bool = False) -> list["Lock"]:
        """Takes every lock of ``keys`` at once, or none: the server takes
        them in ascending key order, each in its FIFO queue, so two sessions
        asking for overlapping keys in different orders never deadlock.
        Returns one :class:`lockd.Lock` per key, in the order of ``keys``,
        each with its key's own fencing token. Waits until granted,
        ``timeout`` seconds pass for the whole set
        (:class:`lockd.WaitTimeout`), ``cancel`` fires
        (:class:`lockd.Cancelled`) or the session ends; a wait that closes a
        cycle of waiting sessions raises :class:`lockd.Deadlock` unless
        ``no_deadlock_check`` (then none of the call's waits is ever a
        deadlock's victim, C2 #ct2-acquire-all). On any
        error the session holds none of the keys it did not hold before.
        1 to 64 distinct keys, plain locks only (docs/contracts/C2.md
        #ct2-acquire-all)."""
        keys = _check_keys(keys)
        req = pb.AcquireRequest(session_id=self.id, session_secret=self._secret, keys=keys, wait=True,
                                no_deadlock_check=no_deadlock_check)
        if timeout is not None:
            if timeout < 0:
                raise errors.InvalidArgument("timeout: negative", field="timeout")
            req.wait_timeout_ms = max(1, math.ceil(timeout * 1000))
        bound = None if timeout is None else timeout + self.c.call_timeout
        return self._acquire_all(req, until_cancel=timeout is None, cancel=cancel, timeout=bound)

    def try_acquire_all(self, keys, timeout: float | None = -1.0) -> list["Lock"]:
        """Takes every lock of ``keys`` if each is free and nobody waits for
        it; otherwise raises :class:`lockd.Locked` and holds none of them.
        Keys as :meth:`acquire_all`."""
        keys = _check_keys(keys)
        req = pb.AcquireRequest(session_id=self.id, session_secret=self._secret, keys=keys)
        return self._acquire_all(req, until_cancel=False, cancel=None, timeout=timeout)

    def _acquire_all(self, req, until_cancel: bool, cancel: Cancel | None, timeout: float | None) -> list["Lock"]:
        return self._send_acquire(req, req.keys, until_cancel, cancel, timeout, lambda resp, sent: self._record_all(req, resp, sent))

    def _record_all(self, req, resp, sent) -> list["Lock"]:
        """Records the grants of an answered acquire_all; a grant it cannot
        record fails the call and the others are given back."""
        if not resp.granted:
            raise errors.Locked(f"one of {list(req.keys)!r} is locked")
        if len(resp.grants) != len(req.keys):
            raise errors.Unavailable(f"the server answered {len(resp.grants)} grants for {len(req.keys)} keys")
        d = self._extend(sent, resp.remaining_ms / 1000.0)
        locks, fresh = [], []
        for i, g in enumerate(resp.grants):
            with self.mu:
                had = self.locks.get(req.keys[i])
            try:
                if g.key != req.keys[i]:
                    raise errors.Unavailable(f"grant {i} names {g.key!r}, not {req.keys[i]!r}")
                l = self._add_lock(g.key, g.token, d)
            except errors.LockdError:
                # All or none: give back what this call was granted.
                for f in fresh:
                    try:
                        f.release(timeout=CLOSE_TIMEOUT)
                    except errors.LockdError as e:
                        log.debug("releasing %r after a failed acquire_all failed: %s", f.key, e)
                for rest in resp.grants[i:]:
                    with self.mu:
                        l = self.locks.get(rest.key)
                    if l is None or l.token != rest.token:
                        self._give_back(rest.key, rest.token)
                raise
            if l is not had:
                fresh.append(l)
            locks.append(l)
        return locks

    def _give_back(self, key: str, token: int) -> None:
        """Releases a grant of a failed acquire_all that no Lock records,
        best effort (the session's end frees it otherwise)."""
        try:
            self.c._call("Release", pb.ReleaseRequest(session_id=self.id, session_secret=self._secret, key=key,
                                                     token=token), timeout=CLOSE_TIMEOUT)
        except errors.LockdError as e:
            log.debug("releasing %r after a failed acquire_all failed: %s", key, e)
