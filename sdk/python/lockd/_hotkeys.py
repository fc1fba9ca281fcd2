"""Hot keys: which keys one lockd process saw waited for and held most over
its recent window (docs/contracts/C2.md #ct2-hotkeys, issue 27)."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import errors
from .v1 import lockd_pb2 as pb

#: the most entries a ranking may ask for (C2 #ct2-hotkeys)
MAX_HOT_KEYS = 50


@dataclass
class HotKey:
    """One key of a ranking. ``score`` may over-estimate the key's true total
    by at most ``overcount`` (a Space-Saving sketch, C4 #ct4-hotkeys) and
    never under-estimates it."""
    key: str
    score: int
    overcount: int = 0


@dataclass
class HotKeys:
    """One lockd process's answer, hottest first, ties by key:
    ``by_wait`` in milliseconds Acquires waited before their grant,
    ``by_hold`` in milliseconds of ended grants' holds, ``by_contention`` in
    Acquires admitted to wait. ``window`` (seconds) is the longest span a
    score covers; ``enabled`` is False when the server keeps no statistics
    (lock.server.stats.enabled), the rankings then empty."""
    by_wait: list[HotKey] = field(default_factory=list)
    by_hold: list[HotKey] = field(default_factory=list)
    by_contention: list[HotKey] = field(default_factory=list)
    window: float = 0.0
    enabled: bool = False


def request(prefix: str, limit: int) -> pb.HotKeysRequest:
    if not isinstance(prefix, str):
        raise errors.InvalidArgument("prefix: not a str", field="prefix")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_HOT_KEYS:
        raise errors.InvalidArgument(f"limit {limit!r}: want 0..{MAX_HOT_KEYS} (0: 10)", field="limit")
    return pb.HotKeysRequest(prefix=prefix, limit=limit)


def answer(resp) -> HotKeys:
    def conv(hs):
        return [HotKey(key=h.key, score=h.score, overcount=h.overcount) for h in hs]
    return HotKeys(by_wait=conv(resp.by_wait), by_hold=conv(resp.by_hold), by_contention=conv(resp.by_contention),
                   window=resp.window_ms / 1000.0, enabled=resp.enabled)
