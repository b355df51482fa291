"""The expected-seq check every backend's writer runs in a command's savepoint.

A command that names the seqs its aggregates must be at either matches the
log's heads (it appends), or is an exact replay of a command already stored
(its stored records come back and nothing is written or published), or is
refused: :class:`SeqConflictError` when the log is behind what it expected,
:class:`DivergedError` when another event holds the seq.

The writers differ only in how they read: the head seq of an aggregate, and a
stored event by id as ``(position, aggregate_id, seq, type, created, data)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from storage.errors import DivergedError, SeqConflictError
from storage.recorder import RecordedEvent

if TYPE_CHECKING:
    from storage.batch import Prepared

__all__ = ["StoredRow", "mismatched", "refusal", "stored_replay"]

#: A stored event as the replay check reads it.
StoredRow = tuple[int, str, int, str, int, str]

Mismatches = dict[str, tuple[int, int]]


def mismatched(prepared: Prepared, head: Callable[[str], int]) -> Mismatches:
    """Each expected aggregate whose head is elsewhere: (wanted, actual)."""
    expected = prepared.command.expected or {}
    return {agg: (want, actual) for agg, want in expected.items() if (actual := head(agg)) != want}


def stored_replay(
    prepared: Prepared, stored: Callable[[str], StoredRow | None]
) -> list[RecordedEvent] | None:
    """The stored records if the command was already committed exactly as given.

    Events are found by id; a replay must match each stored event's aggregate,
    type and data, and sit at the seqs the command expected.
    """
    command = prepared.command
    assert command.expected is not None
    next_seq = dict(command.expected)
    records = []
    for new, (type_, data) in zip(command.events, prepared.encoded, strict=True):
        row = stored(new.id)
        if row is None:
            return None
        position, agg_stored, seq, type_stored, created, data_stored = row
        agg = new.aggregate_id
        want = next_seq.get(agg)
        if (agg_stored, type_stored, data_stored) != (agg, type_, data) or (
            want is not None and int(seq) != want + 1
        ):
            raise DivergedError(agg, int(seq), "id reused with other content or seq")
        next_seq[agg] = int(seq)
        records.append(
            RecordedEvent(
                position=int(position),
                id=new.id,
                aggregate_id=agg,
                seq=int(seq),
                type=type_,
                created=int(created),
                data=data,
                event=new.event,
            )
        )
    return records


def refusal(mismatches: Mismatches) -> SeqConflictError | DivergedError:
    """The error for a command that is neither at its expected seqs nor a replay."""
    agg, (want, actual) = next(iter(mismatches.items()))
    if actual < want:
        return SeqConflictError(agg, want, actual)
    return DivergedError(agg, want + 1, "another event is stored at this seq")
