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
from typing import Generic, TypeVar

__all__ = ["ByteLRU"]

K = TypeVar("K")
V = TypeVar("V")

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
