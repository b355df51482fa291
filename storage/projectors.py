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

import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import orjson

from protocol import codec
from protocol import events as ev
from storage._ops import TOUCH, Op, json_text, touch
from storage._project_compaction import COMPACTION_PROJECTORS
from storage._project_instructions import INSTRUCTION_PROJECTORS
from storage._project_permissions import PERMISSION_PROJECTORS
from storage._project_steps import STEP_PROJECTORS, retry_cleared
from storage._project_structure import STRUCTURE_PROJECTORS
from storage.recorder import RecordedEvent

__all__ = ["Op", "project"]

E = TypeVar("E", bound=ev.Event)


_CREATE: Final = (
    "INSERT INTO session (id, parent_id, title, agent, model, directory, metadata,"
    " time_created, time_updated{}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?{})"
    " ON CONFLICT (id) DO NOTHING"
)


def _created(rec: RecordedEvent, e: ev.SessionCreated) -> tuple[Op, ...]:
    # An import in several commands makes its session hidden (``importing``)
    # until its session.import.finished.
    importing = isinstance(e, ev.ImportStarted)
    return (
        Op(
            _CREATE.format(", importing", ", 1") if importing else _CREATE.format("", ""),
            (
                e.session_id,
                e.parent_id,
                e.title,
                e.agent,
                json_text(e.model),
                e.location.directory,
                json_text(e.metadata),
                rec.created,
                rec.created,
            ),
            expect=1,
            reason="session.exists",
            subject=e.session_id,
        ),
    )


# Each clears the session's retry too, as every event's first op must (see
# _with_retry_cleared): in the statement itself, no second op made to fold it in.
_SET: Final = {
    column: f"UPDATE session SET {column} = ?, time_updated = ?, retry = NULL WHERE id = ?"
    for column in ("title", "metadata", "agent", "model", "revert")
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
    return _set(rec, "metadata", json_text(e.metadata))


def _agent(rec: RecordedEvent, e: ev.AgentSelected) -> tuple[Op, ...]:
    return _set(rec, "agent", e.agent)


def _model(rec: RecordedEvent, e: ev.ModelSelected) -> tuple[Op, ...]:
    return _set(rec, "model", json_text(e.model))


def _import_finished(rec: RecordedEvent, e: ev.ImportFinished) -> tuple[Op, ...]:
    return (
        Op(
            "UPDATE session SET importing = NULL, time_updated = ?"
            " WHERE id = ? AND importing IS NOT NULL",
            (rec.created, e.session_id),
            expect=1,
            reason="session.missing",
            subject=e.session_id,
        ),
    )


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
        touch(rec),
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
                json_text(e.item.payload),
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
    "INSERT INTO session_message"
    " (id, session_id, type, seq, time_created, time_updated, data, changed)"
    " SELECT id, session_id, type, ?, ?, ?,"
    # A JSON object both engines build alike (SQLite's json_object, minified;
    # delivery is 'steer' or 'queue' by the inbox's CHECK).
    """ '{"payload":' || json(payload) || ',"delivery":"' || delivery"""
    """ || '","timeCreated":' || time_created || '}', ?"""
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
        touch(rec),
        Op(
            _DELIVER_MESSAGE,
            (rec.seq, rec.created, rec.created, rec.position, e.inbox_id, e.session_id),
        ),
        _consume_pending(e.session_id, e.inbox_id),
    )


def _cancelled(rec: RecordedEvent, e: ev.InboxCancelled) -> tuple[Op, ...]:
    return (
        touch(rec),
        _consume_pending(e.session_id, e.inbox_id),
    )


def _delivery_changed(rec: RecordedEvent, e: ev.InboxDeliveryChanged) -> tuple[Op, ...]:
    return (
        touch(rec),
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
        touch(rec),
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data, changed)"
            " SELECT ?, ?, 'synthetic', ?, ?, ?, ?, ?"
            " WHERE NOT EXISTS (SELECT 1 FROM session_inbox WHERE id = ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                e.message_id,
                e.session_id,
                rec.seq,
                rec.created,
                rec.created,
                orjson.dumps(data).decode(),
                rec.position,
                e.message_id,
            ),
            expect=1,
            reason="message.id-taken",
            subject=e.message_id,
        ),
    )


def _shell_data(shell: Any, output: str | None) -> str:
    data: dict[str, Any] = {"shell": codec.to_json(shell)}
    if output is not None:
        data["output"] = output
    return orjson.dumps(data).decode()


def _shell_started(rec: RecordedEvent, e: ev.ShellStarted) -> tuple[Op, ...]:
    return (
        touch(rec),
        Op(
            "INSERT INTO session_message"
            " (id, session_id, type, seq, time_created, time_updated, data, changed)"
            " SELECT ?, ?, 'shell', ?, ?, ?, ?, ?"
            " WHERE NOT EXISTS (SELECT 1 FROM session_inbox WHERE id = ?)"
            " ON CONFLICT (id) DO NOTHING",
            (
                e.shell.id,
                e.session_id,
                rec.seq,
                rec.created,
                rec.created,
                _shell_data(e.shell, None),
                rec.position,
                e.shell.id,
            ),
            expect=1,
            reason="message.id-taken",
            subject=e.shell.id,
        ),
    )


def _shell_spawned(rec: RecordedEvent, e: ev.ShellSpawned) -> tuple[Op, ...]:
    process = {"pgid": e.pgid, "startTicks": e.start_ticks, "bootID": e.boot_id}
    return (
        Op(
            "UPDATE session_message SET data = json_set(data, '$.process', json(?)), changed = ?"
            " WHERE id = ? AND session_id = ? AND type = 'shell'"
            " AND json_extract(data, '$.shell.state') = 'running'",
            (orjson.dumps(process).decode(), rec.position, e.shell_id, e.session_id),
            expect=1,
            reason="shell.not-running",
            subject=e.shell_id,
        ),
    )


def _shell_ended(rec: RecordedEvent, e: ev.ShellEnded) -> tuple[Op, ...]:
    return (
        touch(rec),
        Op(
            "UPDATE session_message SET data = ?, time_updated = ?, changed = ?"
            " WHERE id = ? AND session_id = ? AND type = 'shell'"
            " AND json_extract(data, '$.shell.state') = 'running'",
            (_shell_data(e.shell, e.output), rec.created, rec.position, e.shell.id, e.session_id),
            expect=1,
            reason="shell.not-running",
            subject=e.shell.id,
        ),
    )


def _revert_staged(rec: RecordedEvent, e: ev.RevertStaged) -> tuple[Op, ...]:
    return _set(rec, "revert", json_text(e.revert))


def _revert_cleared(rec: RecordedEvent, e: ev.RevertCleared) -> tuple[Op, ...]:
    return _set(rec, "revert", None)


def _revert_committed(rec: RecordedEvent, e: ev.RevertCommitted) -> tuple[Op, ...]:
    # The boundary message and everything after it leave the transcript (their
    # parts cascade); the log keeps them. Instruction state is cleared by the
    # instruction projection's own hook. A user shell still running stays: a
    # revert cannot undo live work, and its entry is what its end (and, after a
    # crash, recovery's kill and cancellation) finds.
    # ``removals`` counts it: a reader holding the session's history (see
    # storage.queries.HistoryCache) reads the whole of it again.
    return (
        Op(
            "DELETE FROM session_message WHERE session_id = ? AND seq >="
            " (SELECT seq FROM session_message WHERE id = ? AND session_id = ?)"
            " AND NOT (type = 'shell' AND json_extract(data, '$.shell.state') = 'running')",
            (e.session_id, e.to, e.session_id),
        ),
        Op(
            "UPDATE session SET revert = NULL, removals = removals + 1, time_updated = ?"
            " WHERE id = ?",
            (rec.created, rec.aggregate_id),
            expect=1,
            reason="session.missing",
            subject=rec.aggregate_id,
        ),
    )


def _typed(fn: Callable[[RecordedEvent, E], tuple[Op, ...]]) -> Callable[..., tuple[Op, ...]]:
    return fn


Projector = Callable[..., tuple[Op, ...]]


def _both(first: Projector, then: Projector) -> Projector:
    def both(rec: RecordedEvent, e: ev.Event) -> tuple[Op, ...]:
        return (*first(rec, e), *then(rec, e))

    return both


def _combined(*tables: dict[type[ev.Event], Projector]) -> dict[type[ev.Event], Projector]:
    """One registry; an event several tables project gets each table's ops, in order."""
    out: dict[type[ev.Event], Projector] = {}
    for table in tables:
        for kind, fn in table.items():
            out[kind] = fn if kind not in out else _both(out[kind], fn)
    return out


_SESSION_PROJECTORS: Final[dict[type[ev.Event], Projector]] = {
    ev.SessionCreated: _typed(_created),
    ev.ImportStarted: _typed(_created),
    ev.ImportFinished: _typed(_import_finished),
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
    ev.ShellStarted: _typed(_shell_started),
    ev.ShellSpawned: _typed(_shell_spawned),
    ev.ShellEnded: _typed(_shell_ended),
    ev.RevertStaged: _typed(_revert_staged),
    ev.RevertCleared: _typed(_revert_cleared),
    ev.RevertCommitted: _typed(_revert_committed),
}

_PROJECTORS: Final = _combined(
    _SESSION_PROJECTORS,
    STEP_PROJECTORS,
    STRUCTURE_PROJECTORS,
    COMPACTION_PROJECTORS,
    PERMISSION_PROJECTORS,
    INSTRUCTION_PROJECTORS,
)


#: A statement that updates one session row by id and leaves ``retry`` alone:
#: the event's retry clearing can ride on it (see :func:`_with_retry_cleared`).
_SESSION_ROW: Final = re.compile(r"UPDATE session SET (?P<set>.+) WHERE id = \?")
#: First ops that clear their session's retry themselves.
_CLEARING: Final = frozenset({TOUCH, *_SET.values()})
#: Each such statement with ``retry = NULL`` added, by statement (None: not one).
#: Bounded by the projectors' own statements, which are constants.
_FOLDED: Final[dict[str, str | None]] = {}


def _folded(sql: str) -> str | None:
    try:
        return _FOLDED[sql]
    except KeyError:
        pass
    match = _SESSION_ROW.fullmatch(sql)
    folded = None
    if match is not None and "retry" not in match["set"] and "WHERE" not in match["set"]:
        folded = f"UPDATE session SET {match['set']}, retry = NULL WHERE id = ?"
    if len(_FOLDED) < 256:
        _FOLDED[sql] = folded
    return folded


def _with_retry_cleared(rec: RecordedEvent, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` preceded by the clearing of the session's retry, in as few statements.

    When the event's first op already updates its session's row by id, it sets
    ``retry = NULL`` too: one statement instead of two for most events. Same
    rows, same values: the first op ran right after the clearing anyway, and a
    command whose op fails rolls back whole. ``touch`` and ``_set``, the first
    op of most events, clear it in their own statements already.
    """
    if ops:
        first = ops[0]
        if first.sql in _CLEARING and first.params[-1] == rec.aggregate_id:
            return ops
        folded = _folded(first.sql)
        if folded is not None and first.params[-1] == rec.aggregate_id:
            # The constructor, not attrs.evolve (this runs for nearly every event).
            op = Op(
                folded,
                first.params,
                expect=first.expect,
                reason=first.reason,
                subject=first.subject,
            )
            return (op, *ops[1:])
    return (retry_cleared(rec), *ops)


def project(rec: RecordedEvent) -> tuple[Op, ...]:
    """The ops that project ``rec``; none for events without a projection."""
    if rec.event is None:
        return ()
    projector = _PROJECTORS.get(type(rec.event))
    ops = () if projector is None else projector(rec, rec.event)
    if isinstance(rec.event, ev.RetryScheduled):
        return ops
    return _with_retry_cleared(rec, ops)
