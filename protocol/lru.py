"""A least-recently-used cache bounded by the bytes its values weigh, not by their count.

Decoded transcript messages range from a few bytes to tens of megabytes (a
prompt with an attachment), so a bound on the number of entries bounds
nothing: 150 one-megabyte prompts behind an 8,000-entry bound held a gigabyte.
Here every entry carries a weight (the caller's estimate of the bytes it keeps
alive) and the oldest entries go until the total is within the bound again. A
value heavier than the whole bound is not kept at all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Generic, TypeVar

__all__ = ["ByteLRU", "reused_prefix"]

K = TypeVar("K")
V = TypeVar("V")

#: How far back from the end of the shorter sequence :func:`reused_prefix` looks
#: (a step appends one or two messages and updates the newest assistant one).
PREFIX_TRIES: Final = 8

#: What an entry costs besides its payload (key, tuple, dict slot, small objects).
ENTRY_OVERHEAD = 256


class ByteLRU(Generic[K, V]):
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """The total weight held now (always <= ``max_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def discard(self, key: K) -> None:
        """Forget ``key`` (nothing happens when it is not held)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]

    def put(self, key: K, value: V, weight: int) -> None:
        weight += ENTRY_OVERHEAD
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if weight > self.max_bytes:
            return
        self._entries[key] = (value, weight)
        self._bytes += weight
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped


def reused_prefix(current: Sequence[object], last: Sequence[object]) -> int:
    """How many leading items of ``current`` a cached ``last`` can serve: 0 if not near the end.

    A session's next history or request is its last one with a few items
    added or changed at the end, so a cache of per-item running sums (the
    conversion, a character count) keeps its entries up to the first
    difference, if that falls within :data:`PREFIX_TRIES` of the shorter
    end; a difference earlier starts over from 0. The head is compared
    once (in C: unchanged items are the same objects), then the tail item
    by item.
    """
    n = min(len(current), len(last))
    low = max(n - PREFIX_TRIES, 0)
    if current[:low] != last[:low]:
        return 0
    for i in range(low, n):
        if current[i] is not last[i] and current[i] != last[i]:
            return i
    return n
