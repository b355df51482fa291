"""Which pending commands a writer lane may take while other lanes have batches in flight.

A store writes through a few connections (lanes). The server still commits
one batch at a time (every batch takes :data:`~._writer.LOG_LOCK` first),
so lanes do not make the database do more at once; what they buy is overlap:
while one batch is on the server, the next one is built in Python and sent,
and it waits for the lock there instead of waiting for the first batch's
answer to come back before it is even encoded. With 100 producers awaiting
their appends, the server is otherwise idle for the whole Python half of
every batch (building it, then resolving the futures and running the
producers again).

What lanes must not change is what a producer can see. Two rules keep it:

- A command never overtakes an earlier command that shares a key with it
  (an aggregate it appends to or expects, the session of its lease or of an
  instruction entry, the parent an event names: a fork's projection copies
  the parent's rows), whether that earlier one is in flight on another lane
  or still pending. So per aggregate, commands commit in submission order,
  and a batch's heads (``seq``) never depend on a batch still in flight.
- Batches on disjoint keys may reach the lock in either order. Their commands
  were submitted without one awaiting the other (a command submitted after
  another's answer comes after it anyway); a caller that needs two sessions'
  commands in order awaits the first, or puts both in one command. Positions
  still follow commit order (they are allocated under the lock).

:func:`take` decides synchronously (no await between the decision and the
batch being marked in flight), so two lanes never take the same command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypeVar

from storage.batch import Prepared, keys

__all__ = ["SPLIT_AT", "Share", "keys", "take"]

#: Outstanding commands below which one batch takes them all: fewer are
#: cheaper in one batch than in two (each pays a call and a COMMIT).
SPLIT_AT: Final = 16
#: A share when there is nothing to split (the store caps it at its batch size).
MAX_SHARE: Final = 1 << 30
#: How fast the estimate of outstanding commands forgets a larger count, per take.
DECAY: Final = 0.9

T = TypeVar("T")


class Share:
    """How many commands one lane's batch should hold, from how many are outstanding.

    Outstanding (pending plus in flight) is seen at each take; the estimate
    is the largest seen lately, decaying by :data:`DECAY` per take, so a
    group of producers briefly invisible (answered, not yet submitting again)
    does not shrink it. One share is the estimate over the lanes, so the
    producers settle into groups of one share taking turns, and a group cut
    smaller once (by a lane that took what had arrived so far) grows back.
    """

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self._estimate = 0.0

    def seen(self, outstanding: int) -> int:
        self._estimate = max(float(outstanding), self._estimate * DECAY)
        if self.lanes < 2 or self._estimate < SPLIT_AT:
            return MAX_SHARE
        return -(-int(self._estimate) // self.lanes)


def take(
    pending: list[tuple[Prepared, T]],
    busy: Sequence[tuple[frozenset[str], int]],
    *,
    share: int,
) -> tuple[list[tuple[Prepared, T]], list[tuple[Prepared, T]], frozenset[str]]:
    """Split ``pending`` into (this lane's batch, what stays pending, the batch's keys).

    ``busy`` holds (keys, commands) of every batch in flight on another lane;
    ``share`` is the most this batch takes (:class:`Share`). With nothing in
    flight the lane takes what it may at once. With a batch in flight it
    waits (takes nothing) until at least a share, or as many as are in
    flight, are pending: a lane that sent every command as it came would cut
    the producers into ever more, ever smaller groups, each batch paying a
    call and a COMMIT for fewer commands. Waiting never delays a command past
    the end of the batch in flight, when it would have gone with one lane.

    Order is kept within both lists.
    """
    if busy and len(pending) < min(share, sum(count for _, count in busy)):
        return [], pending, frozenset()
    blocked: set[str] = set()
    for held, _ in busy:
        blocked |= held
    batch: list[tuple[Prepared, T]] = []
    rest: list[tuple[Prepared, T]] = []
    taken: set[str] = set()
    for item in pending:
        mine = keys(item[0])
        if len(batch) >= share or not blocked.isdisjoint(mine):
            # Held back: so is every later command sharing one of its keys.
            blocked |= mine
            rest.append(item)
        else:
            taken |= mine
            batch.append(item)
    return batch, rest, frozenset(taken)
