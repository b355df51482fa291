"""Projectors of the instruction state: value deltas and the epoch events.

``instruction_state`` holds, per session, the epoch's initial values and the
current values (``{key: sha256hex}``), the epoch start and the seq of the
last delta applied. Everything comes from the events, so a replay rebuilds
the row exactly:

- ``session.instructions.updated``: the first delta of an epoch creates the
  row (initial = current = the delta without removals); a later one patches
  ``current_values`` (a removal deletes the key) and sets ``through_seq``. A
  delta with ``text`` also projects that frozen text as a chronological
  ``system`` transcript message.
- ``session.compaction.ended``: the current values become the initial ones
  and the epoch starts at this seq. No source is read.
- ``session.revert.committed``: the state is cleared; the next boundary
  establishes a fresh baseline.
- ``session.forked``: the new session's baseline is the parent's newest values
  carried by the event.
- ``session.moved``: nothing; the destination's values become updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from protocol import events as ev
from storage._ops import Op, touch
from storage.recorder import RecordedEvent

__all__ = ["INSTRUCTION_PROJECTORS", "system_message_id"]

_CREATE_OR_PATCH: Final = (
    "INSERT INTO instruction_state"
    " (session_id, epoch_start, through_seq, initial_values, current_values)"
    " VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (session_id) DO UPDATE SET through_seq = excluded.through_seq,"
    " current_values = json_patch(instruction_state.current_values, ?)"
)


def system_message_id(event_id: str) -> str:
    """The transcript id of an update's system message: derived from its event's id."""
    return "msg_" + event_id.removeprefix("evt_")


def _values(delta: dict[str, str]) -> str:
    return orjson.dumps({k: v for k, v in delta.items() if v != ev.REMOVED}).decode()


def _updated(rec: RecordedEvent, e: ev.InstructionsUpdated) -> tuple[Op, ...]:
    delta = dict(e.delta)
    values = _values(delta)
    # RFC 7396: a null member deletes the key.
    patch = orjson.dumps({k: (None if v == ev.REMOVED else v) for k, v in delta.items()}).decode()
    ops = [
        touch(rec),
        Op(_CREATE_OR_PATCH, (e.session_id, rec.seq, rec.seq, values, values, patch)),
    ]
    if e.text:
        data = orjson.dumps({"text": e.text, "keys": sorted(delta)}).decode()
        ops.append(
            Op(
                "INSERT INTO session_message"
                " (id, session_id, type, seq, time_created, time_updated, data, changed)"
                " VALUES (?, ?, 'system', ?, ?, ?, ?, ?)",
                (
                    system_message_id(rec.id),
                    e.session_id,
                    rec.seq,
                    rec.created,
                    rec.created,
                    data,
                    rec.position,
                ),
            )
        )
    return tuple(ops)


def _compaction_ended(rec: RecordedEvent, e: ev.CompactionEnded) -> tuple[Op, ...]:
    return (
        Op(
            "UPDATE instruction_state SET epoch_start = ?, through_seq = ?,"
            " initial_values = current_values WHERE session_id = ?",
            (rec.seq, rec.seq, e.session_id),
        ),
    )


def _revert_committed(rec: RecordedEvent, e: ev.RevertCommitted) -> tuple[Op, ...]:
    return (Op("DELETE FROM instruction_state WHERE session_id = ?", (e.session_id,)),)


def _forked(rec: RecordedEvent, e: ev.SessionForked) -> tuple[Op, ...]:
    if e.instructions is None:
        return ()
    values = orjson.dumps(dict(e.instructions)).decode()
    return (
        Op(
            "INSERT INTO instruction_state"
            " (session_id, epoch_start, through_seq, initial_values, current_values)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET"
            " epoch_start = excluded.epoch_start, through_seq = excluded.through_seq,"
            " initial_values = excluded.initial_values, current_values = excluded.current_values",
            (e.session_id, rec.seq, rec.seq, values, values),
        ),
    )


def _typed(fn: Callable[[RecordedEvent, Any], tuple[Op, ...]]) -> Callable[..., tuple[Op, ...]]:
    return fn


INSTRUCTION_PROJECTORS: Final[dict[type[ev.Event], Callable[..., tuple[Op, ...]]]] = {
    ev.InstructionsUpdated: _typed(_updated),
    ev.CompactionEnded: _typed(_compaction_ended),
    ev.RevertCommitted: _typed(_revert_committed),
    ev.SessionForked: _typed(_forked),
}
