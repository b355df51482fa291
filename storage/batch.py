"""What every backend's writer works on: a batch of prepared commands, and their outcomes.

A store turns each submitted :class:`~storage.recorder.Command` into a
:class:`Prepared` on the loop (:func:`prepare`: its events encoded there,
unless it is large, so the writer spends its time on SQL), hands the writer
a batch of them, and gets one :class:`Outcome` per command back, in batch
order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from protocol.events import encode_data, stored_type
from storage.recorder import Command, NewEvent, RecordedEvent

__all__ = ["ENCODE_ON_LOOP", "Outcome", "Prepared", "encode_events", "keys", "prepare"]


# Outcome and Prepared are made once per command on the append path and never
# changed after: plain slotted classes, as a frozen one pays a guarded
# __setattr__ per field at every construction (about half of their cost).


@attrs.define
class Outcome:
    """What became of one command: its records, or the error that refused it."""

    records: list[RecordedEvent] | None = None
    error: BaseException | None = None
    #: False for an idempotent replay: the records were already public.
    publish: bool = True


#: Commands of up to this many events are encoded by their producer, on the
#: loop (overlapping the writer's fsync); larger ones (an import of 200,000
#: messages: a second of Python) by the writer (SQLite's thread), off the loop.
ENCODE_ON_LOOP: Final = 256


@attrs.define
class Prepared:
    """A command with each event's stored type and encoded data: computed on
    the producer's side (:func:`prepare`) so the writer spends its time on
    SQL only, unless the command is large."""

    command: Command
    _encoded: tuple[tuple[str, str], ...] | None = None

    @property
    def encoded(self) -> tuple[tuple[str, str], ...]:
        if self._encoded is None:
            self._encoded = encode_events(self.command.events)
        return self._encoded


def prepare(command: Command) -> Prepared:
    """``command`` ready for a writer: encoded now unless it is large."""
    if len(command.events) > ENCODE_ON_LOOP:
        return Prepared(command=command)
    return Prepared(command=command, encoded=encode_events(command.events))


def encode_events(events: Sequence[NewEvent]) -> tuple[tuple[str, str], ...]:
    """Each event's stored type and JSON data, as :attr:`Prepared.encoded` holds them."""
    if len(events) == 1:  # most commands: no generator for one
        event = events[0].event
        return ((stored_type(event), encode_data(event).decode()),)
    return tuple((stored_type(new.event), encode_data(new.event).decode()) for new in events)


def keys(prepared: Prepared) -> frozenset[str]:
    """The sessions that order ``prepared`` against other commands.

    Every aggregate it appends to or expects, the session of its lease and of
    its instruction entries, and the parent an event names (a fork's
    projection copies the parent's rows). Two commands sharing none write
    disjoint rows, so PostgreSQL's writer may run their statements in
    either order (grouped by statement); two that share one keep theirs.
    """
    command = prepared.command
    events = command.events
    if len(events) == 1 and not (command.expected or command.lease or command.entries):
        # Most commands: one event, nothing else named.
        new = events[0]
        parent = getattr(new.event, "parent_id", None)
        if isinstance(parent, str):
            return frozenset((new.aggregate_id, parent))
        return frozenset((new.aggregate_id,))
    out = {new.aggregate_id for new in events}
    for new in command.events:
        parent = getattr(new.event, "parent_id", None)
        if isinstance(parent, str):
            out.add(parent)
    if command.expected:
        out.update(command.expected)
    if command.lease is not None:
        out.add(command.lease.session_id)
    out.update(entry.session_id for entry in command.entries)
    return frozenset(out)
