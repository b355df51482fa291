"""Projectors: pure functions from a recorded event to the SQL that projects it.

A projector returns :class:`Op`s; it reads nothing and writes nothing itself.
The writer runs the ops in the event's own transaction (under the command's
SAVEPOINT); an op with ``expect`` set must touch exactly that many rows or the
command is rolled back with :class:`~storage.errors.ProjectionConflict`. That
is how lifecycle rules are enforced at the point of truth: a second cancel
deletes nothing, a delivery of a vanished item deletes nothing, and both fail.

Every value written comes from the event and its envelope (seq, created), so
replaying the log from zero rebuilds the tables byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import orjson

from protocol import codec
from protocol import events as ev
from storage.errors import ProjectionConflict
from storage.recorder import RecordedEvent

__all__ = ["Op", "project"]

E = TypeVar("E", bound=ev.Event)


# Conflict messages are formatted only when a conflict happens: building one
# per op on the hot path would cost more than the op's own bookkeeping.
_MESSAGES: Final = {
    "session.missing": "session {} does not exist",
    "session.exists": "session {} already exists",
    "inbox.id-taken": "inbox id {} is already pending or delivered",
    "inbox.not-pending": "inbox item {} is not pending",
    "inbox.delivery-unchanged": "inbox item {} is not pending with the other delivery mode",
    "message.id-taken": "message id {} is already used",
    "message.missing": "assistant message {} does not exist",
    "part.missing": "tool call {} has no projected part",
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


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(codec.to_json(value)).decode()


def _touch(rec: RecordedEvent) -> Op:
    return Op(
        "UPDATE session SET time_updated = ? WHERE id = ?",
        (rec.created, rec.aggregate_id),
        expect=1,
        reason="session.missing",
        subject=rec.aggregate_id,
    )


def _created(rec: RecordedEvent, e: ev.SessionCreated) -> tuple[Op, ...]:
    return (
        Op(
            "INSERT INTO session (id, parent_id, title, agent, model, directory, metadata,"
            " time_created, time_updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                e.session_id,
                e.parent_id,
                e.title,
                e.agent,
                _json(e.model),
                e.location.directory,
                _json(e.metadata),
                rec.created,
                rec.created,
            ),
            expect=1,
            reason="session.exists",
            subject=e.session_id,
        ),
    )


_SET: Final = {
    column: f"UPDATE session SET {column} = ?, time_updated = ? WHERE id = ?"
    for column in ("title", "metadata", "agent", "model")
}


def _set(rec: RecordedEvent, column: str, value: Any) -> tuple[Op, ...]:
    return (
        Op(
            _SET[column],
            (value, rec.created, rec.aggregate_id),
            expect=1,
            reason="session.missing",
            subject=rec.aggregate_id,
        ),
    )


def _renamed(rec: RecordedEvent, e: ev.SessionRenamed) -> tuple[Op, ...]:
    return _set(rec, "title", e.title)


def _metadata(rec: RecordedEvent, e: ev.MetadataUpdated) -> tuple[Op, ...]:
    return _set(rec, "metadata", _json(e.metadata))


def _agent(rec: RecordedEvent, e: ev.AgentSelected) -> tuple[Op, ...]:
    return _set(rec, "agent", e.agent)


def _model(rec: RecordedEvent, e: ev.ModelSelected) -> tuple[Op, ...]:
    return _set(rec, "model", _json(e.model))


def _deleted(rec: RecordedEvent, e: ev.SessionDeleted) -> tuple[Op, ...]:
    # Messages and pending inbox rows go with it (ON DELETE CASCADE).
    return (
        Op(
            "DELETE FROM session WHERE id = ?",
            (e.session_id,),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


def _enqueued(rec: RecordedEvent, e: ev.InboxEnqueued) -> tuple[Op, ...]:
    return (
        _touch(rec),
        Op(
            "INSERT INTO session_inbox"
            " (id, session_id, type, payload, delivery, enqueued_seq, time_created)"
            " SELECT ?, ?, ?, ?, ?, ?, ?"
            " WHERE NOT EXISTS (SELECT 1 FROM session_message WHERE id = ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                e.inbox_id,
                e.session_id,
                e.item.type,
                _json(e.item.payload),
                e.item.delivery,
                rec.seq,
                rec.created,
                e.inbox_id,
            ),
            expect=1,
            reason="inbox.id-taken",
            subject=e.inbox_id,
        ),
    )


# The transcript message keeps what a retry needs to rebuild the admission
# receipt after the inbox row is gone: the payload, the delivery mode and the
# admission time.
_DELIVER_MESSAGE: Final = (
    "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data)"
    " SELECT id, session_id, type, ?, ?, ?,"
    " json_object('payload', json(payload), 'delivery', delivery, 'timeCreated', time_created)"
    " FROM session_inbox WHERE id = ? AND session_id = ? AND type IN ('user', 'synthetic')"
)


def _consume_pending(session_id: str, inbox_id: str) -> Op:
    """Delivery and cancellation both remove the pending row; it must be there."""
    return Op(
        "DELETE FROM session_inbox WHERE id = ? AND session_id = ?",
        (inbox_id, session_id),
        expect=1,
        reason="inbox.not-pending",
        subject=inbox_id,
    )


def _delivered(rec: RecordedEvent, e: ev.InboxDelivered) -> tuple[Op, ...]:
    return (
        _touch(rec),
        Op(_DELIVER_MESSAGE, (rec.seq, rec.created, rec.created, e.inbox_id, e.session_id)),
        _consume_pending(e.session_id, e.inbox_id),
    )


def _cancelled(rec: RecordedEvent, e: ev.InboxCancelled) -> tuple[Op, ...]:
    return (
        _touch(rec),
        _consume_pending(e.session_id, e.inbox_id),
    )


def _delivery_changed(rec: RecordedEvent, e: ev.InboxDeliveryChanged) -> tuple[Op, ...]:
    return (
        _touch(rec),
        Op(
            "UPDATE session_inbox SET delivery = ?"
            " WHERE id = ? AND session_id = ? AND delivery <> ?",
            (e.delivery, e.inbox_id, e.session_id, e.delivery),
            expect=1,
            reason="inbox.delivery-unchanged",
            subject=e.inbox_id,
        ),
    )


def _synthetic(rec: RecordedEvent, e: ev.SyntheticRecorded) -> tuple[Op, ...]:
    payload = {"text": e.text, "description": e.description, "metadata": e.metadata}
    data = {"payload": {k: v for k, v in payload.items() if v is not None}}
    return (
        _touch(rec),
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data)"
            " SELECT ?, ?, 'synthetic', ?, ?, ?, ?"
            " WHERE NOT EXISTS (SELECT 1 FROM session_inbox WHERE id = ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                e.message_id,
                e.session_id,
                rec.seq,
                rec.created,
                rec.created,
                orjson.dumps(data).decode(),
                e.message_id,
            ),
            expect=1,
            reason="message.id-taken",
            subject=e.message_id,
        ),
    )


# -- execution ------------------------------------------------------------------------------------


def _execution_started(rec: RecordedEvent, e: ev.ExecutionStarted) -> tuple[Op, ...]:
    # The write-ahead claim. A resumed execution re-claims as a no-op, and the
    # session's time_updated is left alone: running is not an edit.
    return (
        Op(
            "UPDATE session SET time_claimed = coalesce(time_claimed, ?) WHERE id = ?",
            (rec.created, e.session_id),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


_RELEASE: Final = (
    "UPDATE session SET time_claimed = NULL, resume_attempts = 0, time_updated = ? WHERE id = ?"
)


def _release(rec: RecordedEvent) -> tuple[Op, ...]:
    return (
        Op(
            _RELEASE,
            (rec.created, rec.aggregate_id),
            expect=1,
            reason="session.missing",
            subject=rec.aggregate_id,
        ),
    )


def _execution_succeeded(rec: RecordedEvent, e: ev.ExecutionSucceeded) -> tuple[Op, ...]:
    return _release(rec)


def _execution_failed(rec: RecordedEvent, e: ev.ExecutionFailed) -> tuple[Op, ...]:
    return _release(rec)


def _execution_interrupted(rec: RecordedEvent, e: ev.ExecutionInterrupted) -> tuple[Op, ...]:
    # A shutdown keeps the claim: the next boot resumes the session.
    return (_touch(rec),) if e.reason == "shutdown" else _release(rec)


def _execution_recovering(rec: RecordedEvent, e: ev.ExecutionRecovering) -> tuple[Op, ...]:
    return (
        Op(
            "UPDATE session SET resume_attempts = ? WHERE id = ?",
            (e.attempt, e.session_id),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


# -- steps and parts ------------------------------------------------------------------------------


def _tokens(t: ev.StepTokens) -> dict[str, Any]:
    """Step tokens in the public Tokens shape."""
    return {
        "input": t.input,
        "output": t.output,
        "reasoning": t.reasoning,
        "cache": {"read": t.cache_read, "write": t.cache_write},
    }


def _step_started(rec: RecordedEvent, e: ev.StepStarted) -> tuple[Op, ...]:
    data = {"agent": e.agent, "model": codec.to_json(e.model), "started": e.started}
    return (
        _touch(rec),
        # A later physical attempt of the same step keeps its assistant message.
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data)"
            " VALUES (?, ?, 'assistant', ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (
                e.assistant_message_id,
                e.session_id,
                rec.seq,
                rec.created,
                rec.created,
                orjson.dumps(data).decode(),
            ),
        ),
    )


def _usage(rec: RecordedEvent, cost: float, tokens: ev.StepTokens) -> Op:
    return Op(
        "UPDATE session SET cost = cost + ?, tokens_input = tokens_input + ?,"
        " tokens_output = tokens_output + ?, tokens_reasoning = tokens_reasoning + ?,"
        " tokens_cache_read = tokens_cache_read + ?, tokens_cache_write = tokens_cache_write + ?,"
        " time_updated = ? WHERE id = ?",
        (
            cost,
            tokens.input,
            tokens.output,
            tokens.reasoning,
            tokens.cache_read,
            tokens.cache_write,
            rec.created,
            rec.aggregate_id,
        ),
        expect=1,
        reason="session.missing",
        subject=rec.aggregate_id,
    )


def _message_update(rec: RecordedEvent, message_id: str, fields: dict[str, Any]) -> Op:
    # json_set with json() keeps nested values as JSON, not as quoted strings.
    paths = ", ".join(f"'$.{k}', json(?)" for k in fields)
    return Op(
        f"UPDATE session_message SET data = json_set(data, {paths}), time_updated = ?"
        " WHERE id = ? AND session_id = ?",
        (
            *(orjson.dumps(v).decode() for v in fields.values()),
            rec.created,
            message_id,
            rec.aggregate_id,
        ),
        expect=1,
        reason="message.missing",
        subject=message_id,
    )


def _step_ended(rec: RecordedEvent, e: ev.StepEnded) -> tuple[Op, ...]:
    fields = {"finish": e.finish, "cost": e.cost, "tokens": _tokens(e.tokens)}
    return (
        _message_update(rec, e.assistant_message_id, fields),
        _usage(rec, e.cost, e.tokens),
    )


def _step_failed(rec: RecordedEvent, e: ev.StepFailed) -> tuple[Op, ...]:
    fields: dict[str, Any] = {"error": codec.to_json(e.error)}
    if e.finish is not None:
        fields["finish"] = e.finish
    ops = [_message_update(rec, e.assistant_message_id, fields)]
    if e.cost is not None or e.tokens is not None:
        ops.append(_usage(rec, e.cost or 0.0, e.tokens or ev.StepTokens()))
    else:
        ops.append(_touch(rec))
    return tuple(ops)


_PART_UPSERT: Final = (
    "INSERT INTO session_part (message_id, session_id, key, position, status, data)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (message_id, key) DO UPDATE SET status = excluded.status, data = excluded.data"
)
_PART_INSERT: Final = (
    "INSERT INTO session_part (message_id, session_id, key, position, status, data)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (message_id, key) DO NOTHING"
)


def _part(
    sql: str, rec: RecordedEvent, message_id: str, key: str, status: str | None, data: Any
) -> Op:
    return Op(
        sql,
        (message_id, rec.aggregate_id, key, rec.seq, status, orjson.dumps(data).decode()),
    )


def _block_started(kind: str) -> Callable[..., tuple[Op, ...]]:
    """Text and reasoning blocks: an empty part at start, filled in at the end."""

    def ops(rec: RecordedEvent, e: ev.TextStarted | ev.ReasoningStarted) -> tuple[Op, ...]:
        data = {"type": kind, "ordinal": e.ordinal, "text": ""}
        key = f"{kind}:{e.ordinal}"
        return (_part(_PART_INSERT, rec, e.assistant_message_id, key, None, data),)

    return ops


def _block_ended(kind: str) -> Callable[..., tuple[Op, ...]]:
    def ops(rec: RecordedEvent, e: ev.TextEnded | ev.ReasoningEnded) -> tuple[Op, ...]:
        data = {"type": kind, "ordinal": e.ordinal, "text": e.text}
        return (_part_fill(rec, e.assistant_message_id, f"{kind}:{e.ordinal}", data),)

    return ops


def _part_fill(rec: RecordedEvent, message_id: str, key: str, data: Any) -> Op:
    # Keeps the position of the started part; creates it if no start was recorded.
    return Op(
        "INSERT INTO session_part (message_id, session_id, key, position, status, data)"
        " VALUES (?, ?, ?, ?, NULL, ?)"
        " ON CONFLICT (message_id, key) DO UPDATE SET data = excluded.data",
        (message_id, rec.aggregate_id, key, rec.seq, orjson.dumps(data).decode()),
    )


def _tool_input_started(rec: RecordedEvent, e: ev.ToolInputStarted) -> tuple[Op, ...]:
    data = {"type": "tool", "id": e.id, "name": e.name, "status": "streaming"}
    return (_part(_PART_INSERT, rec, e.assistant_message_id, f"tool:{e.id}", "streaming", data),)


def _tool_input_ended(rec: RecordedEvent, e: ev.ToolInputEnded) -> tuple[Op, ...]:
    return (
        Op(
            "UPDATE session_part SET data = json_set(data, '$.raw', ?)"
            " WHERE message_id = ? AND key = ?",
            (e.text, e.assistant_message_id, f"tool:{e.id}"),
        ),
    )


def _tool_called(rec: RecordedEvent, e: ev.ToolCalled) -> tuple[Op, ...]:
    data = {
        "type": "tool",
        "id": e.id,
        "name": e.name,
        "status": "running",
        "input": dict(e.input),
    }
    return (
        Op(
            "INSERT INTO session_part (message_id, session_id, key, position, status, data)"
            " VALUES (?, ?, ?, ?, 'running', ?)"
            " ON CONFLICT (message_id, key) DO UPDATE SET status = 'running',"
            " data = json_set(session_part.data, '$.status', 'running', '$.input', json(?))",
            (
                e.assistant_message_id,
                e.session_id,
                f"tool:{e.id}",
                rec.seq,
                orjson.dumps(data).decode(),
                orjson.dumps(dict(e.input)).decode(),
            ),
        ),
    )


def _tool_settled(
    rec: RecordedEvent, message_id: str, call_id: str, status: str, fields: dict[str, Any]
) -> tuple[Op, ...]:
    paths = "".join(f", '$.{k}', json(?)" for k in fields)
    return (
        Op(
            f"UPDATE session_part SET status = ?, data = json_set(data, '$.status', ?{paths})"
            " WHERE message_id = ? AND key = ? AND session_id = ?",
            (
                status,
                status,
                *(orjson.dumps(v).decode() for v in fields.values()),
                message_id,
                f"tool:{call_id}",
                rec.aggregate_id,
            ),
            expect=1,
            reason="part.missing",
            subject=call_id,
        ),
    )


def _tool_success(rec: RecordedEvent, e: ev.ToolSucceeded) -> tuple[Op, ...]:
    fields: dict[str, Any] = {"content": [dict(c) for c in e.content]}
    if e.metadata is not None:
        fields["metadata"] = dict(e.metadata)
    return _tool_settled(rec, e.assistant_message_id, e.id, "completed", fields)


def _tool_failed(rec: RecordedEvent, e: ev.ToolFailed) -> tuple[Op, ...]:
    fields: dict[str, Any] = {"error": codec.to_json(e.error)}
    if e.content is not None:
        fields["content"] = [dict(c) for c in e.content]
    if e.metadata is not None:
        fields["metadata"] = dict(e.metadata)
    return _tool_settled(rec, e.assistant_message_id, e.id, "error", fields)


def _typed(fn: Callable[[RecordedEvent, E], tuple[Op, ...]]) -> Callable[..., tuple[Op, ...]]:
    return fn


_PROJECTORS: Final[dict[type[ev.Event], Callable[..., tuple[Op, ...]]]] = {
    ev.SessionCreated: _typed(_created),
    ev.SessionRenamed: _typed(_renamed),
    ev.MetadataUpdated: _typed(_metadata),
    ev.AgentSelected: _typed(_agent),
    ev.ModelSelected: _typed(_model),
    ev.SessionDeleted: _typed(_deleted),
    ev.InboxEnqueued: _typed(_enqueued),
    ev.InboxDelivered: _typed(_delivered),
    ev.InboxCancelled: _typed(_cancelled),
    ev.InboxDeliveryChanged: _typed(_delivery_changed),
    ev.SyntheticRecorded: _typed(_synthetic),
    ev.ExecutionStarted: _typed(_execution_started),
    ev.ExecutionSucceeded: _typed(_execution_succeeded),
    ev.ExecutionFailed: _typed(_execution_failed),
    ev.ExecutionInterrupted: _typed(_execution_interrupted),
    ev.ExecutionRecovering: _typed(_execution_recovering),
    ev.StepStarted: _typed(_step_started),
    ev.StepEnded: _typed(_step_ended),
    ev.StepFailed: _typed(_step_failed),
    ev.TextStarted: _block_started("text"),
    ev.TextEnded: _block_ended("text"),
    ev.ReasoningStarted: _block_started("reasoning"),
    ev.ReasoningEnded: _block_ended("reasoning"),
    ev.ToolInputStarted: _typed(_tool_input_started),
    ev.ToolInputEnded: _typed(_tool_input_ended),
    ev.ToolCalled: _typed(_tool_called),
    ev.ToolSucceeded: _typed(_tool_success),
    ev.ToolFailed: _typed(_tool_failed),
}


def project(rec: RecordedEvent) -> tuple[Op, ...]:
    """The ops that project ``rec``; none for events without a projection."""
    if rec.event is None:
        return ()
    projector = _PROJECTORS.get(type(rec.event))
    return () if projector is None else projector(rec, rec.event)
