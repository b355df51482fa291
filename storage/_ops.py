"""The unit a projector returns: one SQL statement and the row count it must affect."""

from __future__ import annotations

from typing import Any, Final

import attrs
import orjson

from protocol import codec
from storage.errors import ProjectionConflict
from storage.recorder import RecordedEvent

__all__ = [
    "NO_STAGED_REVERT",
    "TOUCH",
    "TOUCH_UNLESS_REVERTED",
    "Op",
    "json_text",
    "no_staged_revert",
    "touch",
]


# Conflict messages are formatted only when a conflict happens: building one
# per op on the hot path would cost more than the op's own bookkeeping.
_MESSAGES: Final = {
    "session.missing": "session {} does not exist",
    "session.exists": "session {} already exists",
    "session.reverted": "session {} has a staged revert (or does not exist)",
    "inbox.id-taken": "inbox id {} is already pending or delivered",
    "inbox.not-pending": "inbox item {} is not pending",
    "inbox.delivery-unchanged": "inbox item {} is not pending with the other delivery mode",
    "message.id-taken": "message id {} is already used",
    "message.missing": "assistant message {} does not exist",
    "part.missing": "tool call {} has no projected part",
    "part.not-running": "tool call {} is not running",
    "compaction.not-running": "session {} has no running compaction",
    "fork.source-missing": "fork source {} or its boundary message does not exist",
}


@attrs.frozen
class Op:
    sql: str
    params: tuple[Any, ...]
    #: Exact row count the statement must affect, or None for "any".
    expect: int | None = None
    #: Stable code of the rule the expectation enforces (see _MESSAGES).
    reason: str = ""
    subject: str = ""

    def conflict(self) -> ProjectionConflict:
        return ProjectionConflict(self.reason, _MESSAGES[self.reason].format(self.subject))


def json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(codec.to_json(value)).decode()


#: :func:`no_staged_revert`'s statement.
NO_STAGED_REVERT: Final = (
    "UPDATE session SET time_updated = time_updated WHERE id = ? AND revert IS NULL"
)


def no_staged_revert(session_id: str) -> Op:
    """A check (:attr:`Command.checks`): the session exists with no staged revert.

    A no-op update, so that it runs as any projector statement does (its row
    count checked); the command's own projections touch the row anyway.
    """
    return Op(
        NO_STAGED_REVERT,
        (session_id,),
        expect=1,
        reason="session.reverted",
        subject=session_id,
    )


#: :func:`touch`'s statement. It clears the session's retry as well: every event
#: but ``session.retry.scheduled`` (which touches nothing) ends the wait, and an
#: event whose first op this is needs no clearing of its own (see
#: ``storage.projectors._with_retry_cleared``).
TOUCH: Final = "UPDATE session SET time_updated = ?, retry = NULL WHERE id = ?"


#: :func:`no_staged_revert` and then :data:`TOUCH` of the same session, as one
#: statement: the same row, the same values (the check writes nothing), one row
#: or none. The SQLite writer runs it for that pair in a grouped run.
TOUCH_UNLESS_REVERTED: Final = (
    "UPDATE session SET time_updated = ?, retry = NULL WHERE id = ? AND revert IS NULL"
)


def touch(rec: RecordedEvent) -> Op:
    return Op(
        TOUCH,
        (rec.created, rec.aggregate_id),
        expect=1,
        reason="session.missing",
        subject=rec.aggregate_id,
    )
