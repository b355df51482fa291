"""A least-recently-used cache bounded by the bytes its values weigh, not by their count.

Decoded transcript messages range from a few bytes to tens of megabytes (a
prompt with an attachment), so a bound on the number of entries bounds
nothing: 150 one-megabyte prompts behind an 8,000-entry bound held a gigabyte.
Here every entry carries a weight (the caller's estimate of the bytes it keeps
alive) and the oldest entries go until the total is within the bound again. A
value heavier than the whole bound is not kept at all, unless the cache is made
with ``oversized="alone"``: then it is kept as the only entry, until the next
``put`` (a session's history that its next step needs whole anyway: dropping it
made every step read and decode it all again, holding the stored text and its
decoded copy at once).

An entry costs the collector no object of its own: the values sit in one
ordered dict and their weights in a plain dict of atoms, which the cyclic
collector does not track. A ``(value, weight)`` tuple per entry was one more
object for every full collection to walk, for every cached message. And a
value itself leaves the collector's generations when it is immutable all the
way down (:func:`protocol.untrack.untrack`: frozen attrs instances, tuples):
the cached transcript messages were most of what a full pass walked under
100 busy sessions, growing with their histories. While every value held is
untracked, the ordered dict holding them is too (a pass visited each of its
entries, 20,000 per cache at 100 sessions x 100 prompts: 15-30 ms a pass).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Generic, Literal, TypeVar

from protocol.untrack import untrack, untrack_dict

__all__ = ["ByteLRU", "reused_prefix"]

K = TypeVar("K")
V = TypeVar("V")

#: How far back from the end of the shorter sequence :func:`reused_prefix` looks
#: (a step appends one or two messages and updates the newest assistant one).
PREFIX_TRIES: Final = 8

#: Keys that leave a dict untracked (the caches' keys are ids and id strings).
_ATOM_KEYS: Final = (str, int, bytes)

#: What an entry costs besides its payload (key, tuple, dict slot, small objects).
ENTRY_OVERHEAD = 256


class ByteLRU(Generic[K, V]):
    def __init__(self, max_bytes: int, *, oversized: Literal["drop", "alone"] = "drop") -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.oversized = oversized
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._weights: dict[K, int] = {}
        #: Keys whose values the collector still tracks (not immutable all the way
        #: down); while there are none, ``_entries`` is left out of its passes.
        self._tracked: set[K] = set()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """The total weight held now: at most ``max_bytes``, or one oversized entry's."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._weights

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is None:
            return None
        self._entries.move_to_end(key)
        return value

    def discard(self, key: K) -> None:
        """Forget ``key`` (nothing happens when it is not held)."""
        weight = self._weights.pop(key, None)
        if weight is not None:
            del self._entries[key]
            self._tracked.discard(key)
            self._bytes -= weight

    def put(self, key: K, value: V, weight: int) -> None:
        weight += ENTRY_OVERHEAD
        self.discard(key)
        if weight > self.max_bytes:
            if self.oversized == "drop":
                return
            self._entries.clear()
            self._weights.clear()
            self._tracked.clear()
            self._bytes = 0
        if not (isinstance(key, _ATOM_KEYS) and untrack(value)):
            self._tracked.add(key)
        self._entries[key] = value
        self._weights[key] = weight
        self._bytes += weight
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            dropped, _ = self._entries.popitem(last=False)
            self._bytes -= self._weights.pop(dropped)
            self._tracked.discard(dropped)
        if not self._tracked:
            untrack_dict(self._entries)  # the store above tracked it again


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
