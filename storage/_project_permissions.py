"""Projectors of permission requests: pending until replied, or expired with their call.

See :mod:`storage.projectors` for what a projector is and promises. A reply
must find its request pending (``permission.not-pending`` otherwise), so a
second answer, or an answer to a request whose call already settled, is a
conflict at the point of truth and never a second decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import orjson

from protocol import codec
from protocol import events as ev
from storage._ops import Op
from storage.recorder import RecordedEvent

__all__ = ["PERMISSION_PROJECTORS", "expire_asks"]


def _asked(rec: RecordedEvent, e: ev.PermissionAsked) -> tuple[Op, ...]:
    return (
        Op(
            "INSERT INTO session_permission (id, session_id, message_id, call_id, permission,"
            " status, asked_seq, time_created, data) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                e.id,
                e.session_id,
                e.assistant_message_id,
                e.call_id,
                e.permission,
                rec.seq,
                rec.created,
                orjson.dumps(codec.to_json(e)).decode(),
            ),
            expect=1,
            reason="permission.id-taken",
            subject=e.id,
        ),
    )


def _replied(rec: RecordedEvent, e: ev.PermissionReplied) -> tuple[Op, ...]:
    return (
        Op(
            "UPDATE session_permission SET status = ?"
            " WHERE id = ? AND session_id = ? AND status = 'pending'",
            (e.reply, e.id, e.session_id),
            expect=1,
            reason="permission.not-pending",
            subject=e.id,
        ),
    )


def expire_asks(message_id: str, call_id: str) -> Op:
    """A call's terminal closes its unanswered requests: nobody may answer them now."""
    return Op(
        "UPDATE session_permission SET status = 'expired'"
        " WHERE message_id = ? AND call_id = ? AND status = 'pending'",
        (message_id, call_id),
    )


def _typed(
    fn: Callable[[RecordedEvent, ev.PermissionAsked], tuple[Op, ...]]
    | Callable[[RecordedEvent, ev.PermissionReplied], tuple[Op, ...]],
) -> Callable[..., tuple[Op, ...]]:
    return fn


PERMISSION_PROJECTORS: Final[dict[type[ev.Event], Callable[..., tuple[Op, ...]]]] = {
    ev.PermissionAsked: _typed(_asked),
    ev.PermissionReplied: _typed(_replied),
}
