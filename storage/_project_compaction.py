"""Projectors of compaction events: one ``compaction`` transcript row per compaction.

``compaction.started`` inserts the row (``running``); ``ended`` completes it
with the summary and the serialized tail, ``failed`` fails it. Only one
compaction of a session runs at a time, so ``ended``/``failed`` update the
session's running one and must find exactly one. The row's id is the manual
request's inbox id, or one derived from the event's own id (stored in the log,
so a replay derives the same). The cost of a compaction counts towards the
session's like a step's.

See :mod:`storage.projectors` for what a projector is and promises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from protocol import codec
from protocol import events as ev
from storage._ops import Op, touch
from storage._project_steps import session_usage
from storage.recorder import RecordedEvent

__all__ = ["COMPACTION_PROJECTORS", "compaction_message_id"]


def compaction_message_id(rec: RecordedEvent, e: ev.CompactionStarted) -> str:
    """The transcript id of the compaction ``rec`` starts."""
    if e.input_id is not None:
        return e.input_id
    return "msg_" + rec.id.removeprefix("evt_")


def _started(rec: RecordedEvent, e: ev.CompactionStarted) -> tuple[Op, ...]:
    data: dict[str, Any] = {"status": "running", "reason": e.reason, "recent": e.recent}
    if e.input_id is not None:
        data["inputID"] = e.input_id
    return (
        touch(rec),
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data, changed)"
            " VALUES (?, ?, 'compaction', ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (
                compaction_message_id(rec, e),
                e.session_id,
                rec.seq,
                rec.created,
                rec.created,
                orjson.dumps(data).decode(),
                rec.position,
            ),
            expect=1,
            reason="message.id-taken",
            subject=compaction_message_id(rec, e),
        ),
    )


_SETTLE: Final = (
    "UPDATE session_message SET time_updated = ?, data = json_patch(data, ?), changed = ?"
    " WHERE session_id = ? AND type = 'compaction'"
    " AND json_extract(data, '$.status') = 'running'"
)


def _settle(rec: RecordedEvent, patch: dict[str, Any]) -> Op:
    return Op(
        _SETTLE,
        (rec.created, orjson.dumps(patch).decode(), rec.position, rec.aggregate_id),
        expect=1,
        reason="compaction.not-running",
        subject=rec.aggregate_id,
    )


def _ended(rec: RecordedEvent, e: ev.CompactionEnded) -> tuple[Op, ...]:
    patch = {"status": "completed", "text": e.text, "recent": e.recent}
    return (touch(rec), _settle(rec, patch), session_usage(rec, e.cost, e.tokens))


def _failed(rec: RecordedEvent, e: ev.CompactionFailed) -> tuple[Op, ...]:
    ops = [touch(rec), _settle(rec, {"status": "failed", "error": codec.to_json(e.error)})]
    if e.cost is not None or e.tokens is not None:
        ops.append(session_usage(rec, e.cost or 0.0, e.tokens or ev.StepTokens()))
    return tuple(ops)


def _typed(fn: Callable[[RecordedEvent, Any], tuple[Op, ...]]) -> Callable[..., tuple[Op, ...]]:
    return fn


COMPACTION_PROJECTORS: Final[dict[type[ev.Event], Callable[..., tuple[Op, ...]]]] = {
    ev.CompactionStarted: _typed(_started),
    ev.CompactionEnded: _typed(_ended),
    ev.CompactionFailed: _typed(_failed),
}
