"""The recorder interface: what any event-log backend provides.

A :class:`Command` is a list of events that commit together or not at all,
optionally with the seq each aggregate must be at before it (optimistic
concurrency). Appending returns the :class:`RecordedEvent`s with their
per-aggregate ``seq`` (1, 2, 3 … without gaps) and global ``position``.

Re-appending a command whose events are already stored at the expected seqs
with the same id, type and data is idempotent: it returns the stored records
and publishes nothing. Any other overlap is a :class:`~storage.errors.DivergedError`.

Live subscribers are called on the event loop, after COMMIT and after the
appenders' futures resolved, with every event of the batch in position order.

``tests/storage/test_recorder_contract.py`` is the contract a backend must pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from protocol import ids
from protocol.events import Event
from storage.lease import LeaseUse

if TYPE_CHECKING:
    from storage._ops import Op

__all__ = [
    "Command",
    "EntryWrite",
    "NewEvent",
    "RecordedEvent",
    "Recorder",
    "Subscriber",
    "now_ms",
]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen(kw_only=True)
class NewEvent:
    """An event about to be appended, with its id and creation time fixed.

    Fixing both up front is what makes an exact replay of a command
    recognisable (idempotent) rather than a new fact.
    """

    event: Event
    id: str = attrs.field(factory=ids.event_id)
    created: int = attrs.field(factory=now_ms)

    @property
    def aggregate_id(self) -> str:
        return self.event.session_id


@attrs.frozen(kw_only=True)
class EntryWrite:
    """An API-managed instruction entry written with a command (not an event).

    ``value`` is the canonical JSON text; None with ``removed`` is a soft
    delete. An upsert whose value is unchanged touches nothing.
    """

    session_id: str
    key: str
    value: str | None
    removed: bool = False
    time: int = attrs.field(factory=now_ms)


@attrs.frozen(kw_only=True)
class Command:
    events: tuple[NewEvent, ...]
    #: aggregate id -> the seq it must be at before this command (0 = empty).
    expected: Mapping[str, int] | None = None
    #: Content-addressed values (SHA-256 hex -> canonical JSON text) stored
    #: once, with the events: the instruction blobs a delta names.
    blobs: Mapping[str, str] = attrs.field(factory=dict)
    #: Instruction entries written in the same transaction.
    entries: tuple[EntryWrite, ...] = ()
    #: The execution lease this command takes, holds (its fence), renews or
    #: releases; checked in the command's savepoint before its events.
    lease: LeaseUse | None = None
    #: Preconditions run in the command's transaction before its events: each
    #: statement must touch exactly its ``expect`` rows, else the command fails
    #: with that op's :class:`~storage.errors.ProjectionConflict` and writes
    #: nothing. Not part of the log: replaying it never runs them. A check reads
    #: projection tables only, never ``event``: the writers hold a batch's event
    #: rows back and run checks in line with the projection ops.
    checks: tuple[Op, ...] = ()

    @classmethod
    def of(
        cls,
        *events: Event,
        expected: Mapping[str, int] | None = None,
        blobs: Mapping[str, str] | None = None,
        lease: LeaseUse | None = None,
        checks: tuple[Op, ...] = (),
    ) -> Command:
        return cls(
            events=(NewEvent(event=events[0]),)  # the usual case, at two thirds the cost
            if len(events) == 1
            else tuple([NewEvent(event=e) for e in events]),
            expected=expected,
            blobs=blobs or {},
            lease=lease,
            checks=checks,
        )

    def with_lease(self, lease: LeaseUse) -> Command:
        """This command taking, holding, renewing or releasing ``lease``.

        Every field by name, not attrs.evolve (a third of the cost; each append
        of an execution comes here): a field added above must be added here.
        """
        return Command(
            events=self.events,
            expected=self.expected,
            blobs=self.blobs,
            entries=self.entries,
            lease=lease,
            checks=self.checks,
        )

    @property
    def empty(self) -> bool:
        return not (self.events or self.blobs or self.entries or self.lease)


@attrs.frozen(kw_only=True)
class RecordedEvent:
    position: int
    id: str
    aggregate_id: str
    seq: int
    type: str
    created: int
    data: str
    #: Decoded value; None when this build does not know ``type``.
    event: Event | None
    #: The lease epoch it was appended under (set on the appender's copy of a
    #: fenced command's records; None otherwise and when read back).
    epoch: int | None = None


Subscriber = Callable[[Sequence[RecordedEvent]], None]


class Recorder(Protocol):
    """An append-only, per-aggregate sequenced event log."""

    async def append(self, command: Command) -> list[RecordedEvent]:
        """Commit ``command`` durably; raise AppendConflictError if it cannot."""
        ...

    async def read(
        self, aggregate_id: str, *, after: int = 0, limit: int = 512
    ) -> list[RecordedEvent]:
        """Events of one aggregate with ``seq > after``, ascending, at most ``limit``."""
        ...

    async def read_all(self, *, after: int = 0, limit: int = 512) -> list[RecordedEvent]:
        """Events of every aggregate with ``position > after``, ascending."""
        ...

    async def last_seq(self, aggregate_id: str) -> int:
        """The latest committed seq of ``aggregate_id``; 0 when it has none."""
        ...

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber`` with each committed batch; returns the unsubscribe function."""
        ...
