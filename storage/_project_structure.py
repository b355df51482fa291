"""Projectors of session structure: forks, moves, views, imported messages, idle marks.

See :mod:`storage.projectors` for what a projector is and promises.

A fork copies rows the parent has *projected* when the fork event is applied.
Replay applies events in position order, so it finds the parent in exactly
the state the writer saw and copies the same rows: the copy is as derived as
any other projection. Copied messages get ids made of the fork event's id and
their source seq (unique, and the same on every replay), and negative seqs
that keep the source order: the child's own log starts at seq 1 with the
fork, so everything copied sorts before anything the child does itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import orjson

from protocol import codec
from protocol import events as ev
from storage._ops import Op, touch
from storage.recorder import RecordedEvent

__all__ = ["STRUCTURE_PROJECTORS", "idle_marked"]

E = TypeVar("E", bound=ev.Event)

# Only settled history crosses: an assistant whose step has no terminal yet
# belongs to the parent's running execution, whose remaining events stay there.
_SETTLED: Final = (
    "(m.type <> 'assistant' OR json_extract(m.data, '$.finish') IS NOT NULL"
    " OR json_extract(m.data, '$.error') IS NOT NULL)"
    # Nor what a staged revert hides (its boundary message and all after it).
    " AND NOT EXISTS (SELECT 1 FROM session rs JOIN session_message rb"
    " ON rb.id = json_extract(rs.revert, '$.messageID') AND rb.session_id = rs.id"
    " WHERE rs.id = m.session_id AND m.seq >= rb.seq)"
)


def _copied(e: ev.SessionForked) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause (over ``m``, the parent's messages) selecting what the fork copies."""
    message_id = e.boundary.message_id
    if message_id is None:
        return "1 = 0", ()
    cmp = "<" if e.boundary.type == "before" else "<="
    return (
        f"m.session_id = ? AND {_SETTLED} AND m.seq {cmp}"
        " (SELECT seq FROM session_message WHERE id = ? AND session_id = ?)",
        (e.parent_id, message_id, e.parent_id),
    )


def _forked(rec: RecordedEvent, e: ev.SessionForked) -> tuple[Op, ...]:
    evt = rec.id.removeprefix("evt_")
    where, params = _copied(e)
    boundary = orjson.dumps(codec.to_json(e.boundary)).decode()
    return (
        Op(
            "INSERT INTO session (id, parent_id, title, agent, model, directory, metadata,"
            " fork_session_id, fork_boundary, time_created, time_updated)"
            " SELECT ?, NULL, title, agent, model, directory, metadata, id, ?, ?, ?"
            " FROM session WHERE id = ? AND (CAST(? AS TEXT) IS NULL"
            " OR EXISTS (SELECT 1 FROM session_message"
            " WHERE id = ? AND session_id = ?)) ON CONFLICT (id) DO NOTHING",
            (
                e.session_id,
                boundary,
                rec.created,
                rec.created,
                e.parent_id,
                e.boundary.message_id,
                e.boundary.message_id,
                e.parent_id,
            ),
            expect=1,
            reason="fork.source-missing",
            subject=e.parent_id,
        ),
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data, changed)"
            " SELECT 'msg_' || ? || '_' || m.seq, ?, m.type,"
            " m.seq - (SELECT max(seq) FROM session_message WHERE session_id = ?) - 1,"
            f" m.time_created, m.time_updated, m.data, ? FROM session_message m WHERE {where}",
            (evt, e.session_id, e.parent_id, rec.position, *params),
        ),
        Op(
            "INSERT INTO session_part"
            " (message_id, session_id, key, position, status, data, changed)"
            " SELECT 'msg_' || ? || '_' || m.seq, ?, p.key, p.position, p.status, p.data, ?"
            f" FROM session_part p JOIN session_message m ON m.id = p.message_id WHERE {where}",
            (evt, e.session_id, rec.position, *params),
        ),
    )


def _viewed(rec: RecordedEvent, e: ev.SessionViewed) -> tuple[Op, ...]:
    # A monotone watermark: a stale or repeated view never moves it back, and
    # viewing is not an edit, so time_updated stays.
    return (
        Op(
            "UPDATE session SET time_viewed = max(?, coalesce(time_viewed, ?)) WHERE id = ?",
            (e.idle, e.idle, e.session_id),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


def _moved(rec: RecordedEvent, e: ev.SessionMoved) -> tuple[Op, ...]:
    # The Location changes; instruction state stays (the instruction
    # projector has nothing for this event), so the destination's sources
    # arrive as chronological updates at the next step.
    return (
        Op(
            "UPDATE session SET directory = ?, time_updated = ? WHERE id = ?",
            (e.location.directory, rec.created, e.session_id),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


def idle_marked(rec: RecordedEvent) -> Op:
    """The session went idle at ``rec.created``.

    Strictly increasing even within one millisecond, so a terminal committed
    after a client's view always reads as unread again.
    """
    return Op(
        "UPDATE session SET time_idle = max(?, coalesce(time_idle + 1, ?)) WHERE id = ?",
        (rec.created, rec.created, rec.aggregate_id),
    )


def _stored_message(message: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[Any]]:
    """(type, stored data, parts) of a public message JSON (the inverse of the reads)."""
    kind = str(message["type"])
    if kind == "assistant":
        data = {
            k: message[k]
            for k in ("agent", "model", "finish", "error", "tokens", "cost", "providerState")
            if message.get(k) is not None
        }
        return kind, data, list(message.get("parts") or ())
    payload = {
        k: message[k]
        for k in ("text", "files", "description", "metadata")
        if message.get(k) is not None
    }
    time = message.get("time") or {}
    return kind, {"payload": payload, "timeCreated": time.get("created")}, []


def _part_key(part: Mapping[str, Any]) -> str:
    # The keys the step projectors use; actors.transfer refuses a document
    # whose parts would collide on them.
    if part.get("type") == "tool":
        return f"tool:{part['id']}"
    return f"{part.get('type')}:{part.get('ordinal')}"


def _message_imported(rec: RecordedEvent, e: ev.MessageImported) -> tuple[Op, ...]:
    kind, data, parts = _stored_message(e.message)
    message_id = str(e.message["id"])
    time = e.message.get("time") or {}
    created = int(time.get("created", rec.created))
    ops = [
        touch(rec),
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data, changed)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (
                message_id,
                e.session_id,
                kind,
                rec.seq,
                created,
                int(time.get("updated", created)),
                orjson.dumps(data).decode(),
                rec.position,
            ),
            expect=1,
            reason="message.id-taken",
            subject=message_id,
        ),
    ]
    for position, part in enumerate(parts):
        status = part.get("status") if part.get("type") == "tool" else None
        ops.append(
            Op(
                "INSERT INTO session_part"
                " (message_id, session_id, key, position, status, data, changed)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    message_id,
                    e.session_id,
                    _part_key(part),
                    position,
                    status,
                    orjson.dumps(part).decode(),
                    rec.position,
                ),
            )
        )
    return tuple(ops)


def _usage_recorded(rec: RecordedEvent, e: ev.UsageRecorded) -> tuple[Op, ...]:
    t = e.tokens
    return (
        Op(
            "UPDATE session SET cost = cost + ?, tokens_input = tokens_input + ?,"
            " tokens_output = tokens_output + ?, tokens_reasoning = tokens_reasoning + ?,"
            " tokens_cache_read = tokens_cache_read + ?,"
            " tokens_cache_write = tokens_cache_write + ? WHERE id = ?",
            (
                e.cost,
                t.input,
                t.output,
                t.reasoning,
                t.cache_read,
                t.cache_write,
                e.session_id,
            ),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


def _typed(fn: Callable[[RecordedEvent, E], tuple[Op, ...]]) -> Callable[..., tuple[Op, ...]]:
    return fn


STRUCTURE_PROJECTORS: Final[dict[type[ev.Event], Callable[..., tuple[Op, ...]]]] = {
    ev.SessionForked: _typed(_forked),
    ev.SessionViewed: _typed(_viewed),
    ev.SessionMoved: _typed(_moved),
    ev.MessageImported: _typed(_message_imported),
    ev.UsageRecorded: _typed(_usage_recorded),
}
