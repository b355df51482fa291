"""Projectors of execution and step events: claims, assistant messages, parts.

See :mod:`storage.projectors` for what a projector is and promises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import orjson

from protocol import codec
from protocol import events as ev
from storage._ops import Op, touch
from storage._project_permissions import expire_asks
from storage._project_structure import idle_marked
from storage.recorder import RecordedEvent

__all__ = ["STEP_PROJECTORS", "retry_cleared", "session_usage"]

E = TypeVar("E", bound=ev.Event)


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
    # Releasing the claim is also the session going idle.
    return (
        Op(
            _RELEASE,
            (rec.created, rec.aggregate_id),
            expect=1,
            reason="session.missing",
            subject=rec.aggregate_id,
        ),
        idle_marked(rec),
    )


def _execution_succeeded(rec: RecordedEvent, e: ev.ExecutionSucceeded) -> tuple[Op, ...]:
    return _release(rec)


def _execution_failed(rec: RecordedEvent, e: ev.ExecutionFailed) -> tuple[Op, ...]:
    return _release(rec)


def _execution_interrupted(rec: RecordedEvent, e: ev.ExecutionInterrupted) -> tuple[Op, ...]:
    # A shutdown keeps the claim: the next boot resumes the session.
    return (touch(rec),) if e.reason == "shutdown" else _release(rec)


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


def _retry_state(e: ev.RetryScheduled) -> dict[str, Any]:
    """The session's ``retry`` member (:class:`protocol.shapes.RetryState`)."""
    return {
        "assistantMessageID": e.assistant_message_id,
        "attempt": e.attempt,
        "at": e.at,
        "error": codec.to_json(e.error),
    }


def _retry_scheduled(rec: RecordedEvent, e: ev.RetryScheduled) -> tuple[Op, ...]:
    # Waiting is not an edit either: time_updated stays.
    return (
        Op(
            "UPDATE session SET retry = ? WHERE id = ?",
            (orjson.dumps(_retry_state(e)).decode(), e.session_id),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


#: Any later event of the session clears its projected retry (see :func:`retry_cleared`).
_RETRY_CLEARED: Final = "UPDATE session SET retry = NULL WHERE id = ? AND retry IS NOT NULL"


def retry_cleared(rec: RecordedEvent) -> Op:
    """The projected retry state ends with the next event of its session.

    A retry is followed by the retried attempt's output, another retry, a
    terminal, or (after a crash) recovery's events: each of them means the
    wait is over. One rule for every event keeps replay and live projection
    trivially equal.
    """
    return Op(_RETRY_CLEARED, (rec.aggregate_id,))


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
        touch(rec),
        # A later physical attempt of the same step keeps its assistant message.
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data, changed)"
            " VALUES (?, ?, 'assistant', ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (
                e.assistant_message_id,
                e.session_id,
                rec.seq,
                rec.created,
                rec.created,
                orjson.dumps(data).decode(),
                rec.position,
            ),
        ),
    )


def session_usage(rec: RecordedEvent, cost: float, tokens: ev.StepTokens) -> Op:
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
    # Every json_set value goes through json(): nested values stay JSON, not
    # quoted strings, and the PostgreSQL twin of json_set takes JSON values only.
    paths = ", ".join(f"'$.{k}', json(?)" for k in fields)
    return Op(
        f"UPDATE session_message SET data = json_set(data, {paths}), time_updated = ?,"
        " changed = ? WHERE id = ? AND session_id = ?",
        (
            *(orjson.dumps(v).decode() for v in fields.values()),
            rec.created,
            rec.position,
            message_id,
            rec.aggregate_id,
        ),
        expect=1,
        reason="message.missing",
        subject=message_id,
    )


def _step_ended(rec: RecordedEvent, e: ev.StepEnded) -> tuple[Op, ...]:
    fields: dict[str, Any] = {"finish": e.finish, "cost": e.cost, "tokens": _tokens(e.tokens)}
    if e.provider_state is not None:
        fields["providerState"] = dict(e.provider_state)
    return (
        _message_update(rec, e.assistant_message_id, fields),
        session_usage(rec, e.cost, e.tokens),
    )


def _step_failed(rec: RecordedEvent, e: ev.StepFailed) -> tuple[Op, ...]:
    fields: dict[str, Any] = {"error": codec.to_json(e.error)}
    if e.finish is not None:
        fields["finish"] = e.finish
    if e.provider_state is not None:
        fields["providerState"] = dict(e.provider_state)
    ops = [_message_update(rec, e.assistant_message_id, fields)]
    if e.cost is not None or e.tokens is not None:
        ops.append(session_usage(rec, e.cost or 0.0, e.tokens or ev.StepTokens()))
    else:
        ops.append(touch(rec))
    return tuple(ops)


_PART_INSERT: Final = (
    "INSERT INTO session_part (message_id, session_id, key, position, status, data, changed)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (message_id, key) DO NOTHING"
)


def _part(
    sql: str, rec: RecordedEvent, message_id: str, key: str, status: str | None, data: Any
) -> Op:
    return Op(
        sql,
        (
            message_id,
            rec.aggregate_id,
            key,
            rec.seq,
            status,
            orjson.dumps(data).decode(),
            rec.position,
        ),
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
        "INSERT INTO session_part (message_id, session_id, key, position, status, data, changed)"
        " VALUES (?, ?, ?, ?, NULL, ?, ?)"
        " ON CONFLICT (message_id, key) DO UPDATE SET data = excluded.data,"
        " changed = excluded.changed",
        (message_id, rec.aggregate_id, key, rec.seq, orjson.dumps(data).decode(), rec.position),
    )


def _tool_input_started(rec: RecordedEvent, e: ev.ToolInputStarted) -> tuple[Op, ...]:
    data = {"type": "tool", "id": e.id, "name": e.name, "status": "streaming"}
    return (_part(_PART_INSERT, rec, e.assistant_message_id, f"tool:{e.id}", "streaming", data),)


def _tool_input_ended(rec: RecordedEvent, e: ev.ToolInputEnded) -> tuple[Op, ...]:
    return (
        Op(
            "UPDATE session_part SET data = json_set(data, '$.raw', json(?)), changed = ?"
            " WHERE message_id = ? AND key = ?",
            (orjson.dumps(e.text).decode(), rec.position, e.assistant_message_id, f"tool:{e.id}"),
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
    if e.provider_executed:
        # Kept from the start, not only on the terminal: a hosted call a crash
        # cut off is failed as stale without metadata, and must still read as hosted.
        data["metadata"] = {"providerExecuted": True}
    return (
        Op(
            "INSERT INTO session_part"
            " (message_id, session_id, key, position, status, data, changed)"
            " VALUES (?, ?, ?, ?, 'running', ?, ?)"
            " ON CONFLICT (message_id, key) DO UPDATE SET status = 'running',"
            " data = json_set(session_part.data, '$.status', json('\"running\"'),"
            " '$.input', json(?)), changed = excluded.changed",
            (
                e.assistant_message_id,
                e.session_id,
                f"tool:{e.id}",
                rec.seq,
                orjson.dumps(data).decode(),
                rec.position,
                orjson.dumps(dict(e.input)).decode(),
            ),
        ),
    )


def _tool_spawned(rec: RecordedEvent, e: ev.ToolSpawned) -> tuple[Op, ...]:
    # Only for a call still running: a record that lost the race with the
    # call's terminal (or its session's deletion) would name a dead group forever.
    return (
        Op(
            "INSERT INTO tool_process"
            " (message_id, call_id, session_id, pgid, start_ticks, boot_id)"
            " SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM session_part"
            " WHERE message_id = ? AND key = ? AND session_id = ? AND status = 'running')",
            (
                e.assistant_message_id,
                e.id,
                rec.aggregate_id,
                e.pgid,
                e.start_ticks,
                e.boot_id,
                e.assistant_message_id,
                f"tool:{e.id}",
                rec.aggregate_id,
            ),
            expect=1,
            reason="part.not-running",
            subject=e.id,
        ),
    )


def _tool_settled(
    rec: RecordedEvent, message_id: str, call_id: str, status: str, fields: dict[str, Any]
) -> tuple[Op, ...]:
    paths = "".join(f", '$.{k}', json(?)" for k in fields)
    return (
        expire_asks(message_id, call_id),
        # The call's process group is the tool's to end; from here nothing owns it.
        Op(
            "DELETE FROM tool_process WHERE message_id = ? AND call_id = ?",
            (message_id, call_id),
        ),
        Op(
            "UPDATE session_part SET status = ?,"
            f" data = json_set(data, '$.status', json(?){paths}), changed = ?"
            " WHERE message_id = ? AND key = ? AND session_id = ?",
            (
                status,
                orjson.dumps(status).decode(),
                *(orjson.dumps(v).decode() for v in fields.values()),
                rec.position,
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


STEP_PROJECTORS: Final[dict[type[ev.Event], Callable[..., tuple[Op, ...]]]] = {
    ev.ExecutionStarted: _typed(_execution_started),
    ev.ExecutionSucceeded: _typed(_execution_succeeded),
    ev.ExecutionFailed: _typed(_execution_failed),
    ev.ExecutionInterrupted: _typed(_execution_interrupted),
    ev.ExecutionRecovering: _typed(_execution_recovering),
    ev.StepStarted: _typed(_step_started),
    ev.StepEnded: _typed(_step_ended),
    ev.StepFailed: _typed(_step_failed),
    ev.RetryScheduled: _typed(_retry_scheduled),
    ev.TextStarted: _block_started("text"),
    ev.TextEnded: _block_ended("text"),
    ev.ReasoningStarted: _block_started("reasoning"),
    ev.ReasoningEnded: _block_ended("reasoning"),
    ev.ToolInputStarted: _typed(_tool_input_started),
    ev.ToolInputEnded: _typed(_tool_input_ended),
    ev.ToolCalled: _typed(_tool_called),
    ev.ToolSpawned: _typed(_tool_spawned),
    ev.ToolSucceeded: _typed(_tool_success),
    ev.ToolFailed: _typed(_tool_failed),
}
