"""One batch of commands, committed on PostgreSQL: the twin of :mod:`storage._writer`.

A batch is one transaction; each command runs under its own SAVEPOINT, so a
conflicting command rolls back alone and the others commit. The semantics are
SQLite's (read that module first); what differs is that several processes,
on several hosts, may write one database:

- Every batch takes one transaction-scoped advisory lock (:data:`LOG_LOCK`)
  first, so batches commit one at a time across all writers. That is what
  makes ``seq`` safe (the batch reads each touched aggregate's latest seq
  under the lock; the ``UNIQUE (aggregate_id, seq)`` constraint is the
  backstop) and makes ``position`` (a sequence, allocated under the lock)
  follow commit order: once ``position = p`` is visible, every event with a
  smaller position is either visible too or never will be. ``read_all(after)``
  therefore never skips an event that commits later; positions may have gaps
  (a rolled-back command's values are not reused). Nothing takes a position
  but under the lock: the fast path takes a batch's positions as one block
  (``setval`` past them), which a value taken elsewhere meanwhile would land
  inside.
- :class:`CommandGuard` runs inside each command's SAVEPOINT, after the seq
  checks and before anything is written: the place for a per-command check
  against other tables (fencing a stale execution epoch). It raises an
  :class:`~storage.errors.AppendConflictError` to refuse the command alone.
- The batch NOTIFYs its commit in the same transaction (delivered only if it
  commits): see :mod:`.notify`. It does so only while a process of another
  origin listens (:mod:`.listeners`, read under the lock).

Each batch first tries the optimistic path of :mod:`._fast` (the whole batch
in one round trip, no savepoints); a batch it cannot take, or that fails on
it, is rolled back and redone here, where the failing command is isolated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import asyncpg

from storage._pg_lease import fence_records, use_lease
from storage._replay import mismatched, refusal, stored_replay
from storage.batch import Outcome, Prepared
from storage.errors import (
    AppendConflictError,
    StorageBrokenError,
)
from storage.postgres._fast import Fallback, Heads, Plans, commit_fast
from storage.postgres.dialect import affected, translate
from storage.postgres.listeners import OTHERS_LISTEN
from storage.postgres.notify import payloads
from storage.projectors import project
from storage.recorder import Command, RecordedEvent

__all__ = ["LOG_LOCK", "BatchResult", "CommandGuard", "Heads", "Plans", "commit_batch"]

#: Key of the advisory lock every batch holds until its COMMIT ("sesslog\0").
LOG_LOCK: Final = 0x7365_7373_6C6F_6700

CommandGuard = Callable[[asyncpg.Connection, Command], Awaitable[None]]

_INSERT_EVENTS: Final = (
    "INSERT INTO event (id, aggregate_id, seq, type, created, data)"
    " SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[],"
    " $6::text[]) RETURNING id, position"
)
_HEADS: Final = (
    "SELECT aggregate_id, max(seq) FROM event WHERE aggregate_id = ANY($1::text[])"
    " GROUP BY aggregate_id"
)
_STORED: Final = (
    "SELECT id, position, aggregate_id, seq, type, created, data FROM event"
    " WHERE id = ANY($1::text[])"
)
_INSERT_BLOBS: Final = (
    "INSERT INTO instruction_blob (hash, value) SELECT * FROM unnest($1::text[], $2::text[])"
    " ON CONFLICT (hash) DO NOTHING"
)
_UPSERT_ENTRY: Final = (
    "INSERT INTO instruction_entry (session_id, key, value, removed, time_created, time_updated)"
    " VALUES ($1, $2, $3, 0, $4, $4)"
    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value, removed = 0,"
    " time_updated = excluded.time_updated"
    " WHERE instruction_entry.value IS DISTINCT FROM excluded.value"
    " OR instruction_entry.removed <> 0"
)
_REMOVE_ENTRY: Final = (
    "UPDATE instruction_entry SET value = NULL, removed = 1, time_updated = $1"
    " WHERE session_id = $2 AND key = $3 AND removed = 0"
)

#: SQLSTATE classes that fail one command (bad data, a constraint), not the batch.
_COMMAND_CLASSES: Final = ("22", "23")


class BatchResult:
    """Outcomes in batch order, and the records the batch published (committed, not replays)."""

    def __init__(
        self, outcomes: list[Outcome], published: list[RecordedEvent], *, fast: bool = False
    ) -> None:
        self.outcomes = outcomes
        self.published = published
        #: Committed by the optimistic path (no savepoints).
        self.fast = fast


async def commit_batch(
    conn: asyncpg.Connection,
    batch: Sequence[Prepared],
    *,
    guard: CommandGuard | None,
    plans: Plans,
    heads: Heads,
    channel: str,
    origin: str,
    own: Callable[[int, int], None],
    fast: bool = True,
) -> BatchResult:
    """Commit ``batch`` in one transaction; raise only if the batch as a whole failed.

    The batch NOTIFYs ``channel`` with ``origin``'s payloads; ``own`` is told
    the positions it took (before COMMIT here, right after it on the fast
    path: the caller keeps catch-up reads out meanwhile). ``fast`` False skips
    the optimistic path (tests compare the two).
    """
    if fast and guard is None:
        try:
            outcomes, published = await commit_fast(
                conn, batch, plans, heads, lock=LOG_LOCK, channel=channel, origin=origin, own=own
            )
            return BatchResult(outcomes, published, fast=True)
        except Fallback:
            pass
    try:
        result, seqs = await _commit_savepoints(conn, batch, guard, channel, origin, own)
    except BaseException:
        heads.forget({new.aggregate_id for p in batch for new in p.command.events})
        raise
    heads.moved(seqs)  # read under the lock and committed: exact
    return result


async def _commit_savepoints(
    conn: asyncpg.Connection,
    batch: Sequence[Prepared],
    guard: CommandGuard | None,
    channel: str,
    origin: str,
    own: Callable[[int, int], None],
) -> tuple[BatchResult, dict[str, int]]:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOG_LOCK)
        aggregates = sorted(
            {new.aggregate_id for p in batch for new in p.command.events}
            | {agg for p in batch for agg in (p.command.expected or {})}
        )
        seqs = dict.fromkeys(aggregates, 0)
        if aggregates:
            seqs.update((r[0], int(r[1])) for r in await conn.fetch(_HEADS, aggregates))
        outcomes = [await _apply(conn, prepared, seqs, guard) for prepared in batch]
        published = [
            record
            for outcome in outcomes
            if outcome.publish and outcome.records is not None
            for record in outcome.records
        ]
        if published:
            # Known before COMMIT, so a catch-up racing this commit skips it too.
            own(published[0].position, published[-1].position)
        notices = payloads(origin, published)
        if notices and await conn.fetchval(OTHERS_LISTEN, origin):
            for payload in notices:
                await conn.execute("SELECT pg_notify($1, $2)", channel, payload)
    return BatchResult(outcomes, published), seqs


async def _apply(
    conn: asyncpg.Connection,
    prepared: Prepared,
    seqs: dict[str, int],
    guard: CommandGuard | None,
) -> Outcome:
    command = prepared.command
    undo: list[tuple[str, int]] = []
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        epoch = None if command.lease is None else await use_lease(conn, command.lease)
        replay = await _check_expected(conn, prepared, seqs)
        if replay is not None:
            await savepoint.commit()
            return Outcome(records=replay, publish=False)
        if guard is not None:
            await guard(conn, command)
        for check in command.checks:
            status = await conn.execute(translate(check.sql), *check.params)
            if check.expect is not None and affected(status) != check.expect:
                raise check.conflict()
        records = await _insert(conn, prepared, seqs, undo)
        await _write_side(conn, command)
        if command.lease is not None and epoch is not None:
            records = await fence_records(conn, command.lease, epoch, records)
        await savepoint.commit()
        return Outcome(records=records)
    except asyncpg.PostgresError as exc:
        if not (exc.sqlstate or "").startswith(_COMMAND_CLASSES):
            raise  # the database failed: the whole batch fails
        await _undo(savepoint, seqs, undo)
        if (exc.sqlstate or "").startswith("23"):
            return Outcome(error=AppendConflictError(f"constraint violated: {_message(exc)}"))
        return Outcome(error=StorageBrokenError(f"the database refused the data: {_message(exc)}"))
    except Exception as exc:
        # A conflict, a guard's refusal, or a bug in a projector: it fails its
        # own command instead of taking the batch down with it.
        await _undo(savepoint, seqs, undo)
        return Outcome(error=exc)


def _message(exc: asyncpg.PostgresError) -> str:
    return str(getattr(exc, "message", None) or exc)


async def _undo(
    savepoint: asyncpg.transaction.Transaction, seqs: dict[str, int], undo: list[tuple[str, int]]
) -> None:
    await savepoint.rollback()
    for aggregate_id, seq in reversed(undo):
        seqs[aggregate_id] = seq


async def _check_expected(
    conn: asyncpg.Connection, prepared: Prepared, seqs: dict[str, int]
) -> list[RecordedEvent] | None:
    """Raise on a seq mismatch; return stored records for an exact replay."""
    command = prepared.command
    if not command.expected:
        return None
    mismatches = mismatched(prepared, seqs.__getitem__)
    if not mismatches:
        return None
    rows = {
        r[0]: (r[1], r[2], r[3], r[4], r[5], r[6])
        for r in await conn.fetch(_STORED, [e.id for e in command.events])
    }
    stored = stored_replay(prepared, rows.get)
    if stored is not None:
        return stored
    raise refusal(mismatches)


async def _insert(
    conn: asyncpg.Connection,
    prepared: Prepared,
    seqs: dict[str, int],
    undo: list[tuple[str, int]],
) -> list[RecordedEvent]:
    events = prepared.command.events
    if not events:
        return []
    numbered = []
    for new in events:
        agg = new.aggregate_id
        undo.append((agg, seqs[agg]))
        seqs[agg] += 1
        numbered.append(seqs[agg])
    columns = (
        [new.id for new in events],
        [new.aggregate_id for new in events],
        numbered,
        [type_ for type_, _ in prepared.encoded],
        [new.created for new in events],
        [data for _, data in prepared.encoded],
    )
    positions = {r[0]: int(r[1]) for r in await conn.fetch(_INSERT_EVENTS, *columns)}
    records = [
        RecordedEvent(
            position=positions[new.id],
            id=new.id,
            aggregate_id=new.aggregate_id,
            seq=seq,
            type=type_,
            created=new.created,
            data=data,
            event=new.event,
        )
        for new, seq, (type_, data) in zip(events, numbered, prepared.encoded, strict=True)
    ]
    records.sort(key=lambda r: r.position)
    for record in records:
        for op in project(record):
            status = await conn.execute(translate(op.sql), *op.params)
            if op.expect is not None and affected(status) != op.expect:
                raise op.conflict()
    return records


async def _write_side(conn: asyncpg.Connection, command: Command) -> None:
    """The command's non-event rows: blobs (insert-or-ignore) and entries."""
    if command.blobs:
        await conn.execute(_INSERT_BLOBS, list(command.blobs), list(command.blobs.values()))
    for entry in command.entries:
        if entry.removed:
            await conn.execute(_REMOVE_ENTRY, entry.time, entry.session_id, entry.key)
        else:
            await conn.execute(_UPSERT_ENTRY, entry.session_id, entry.key, entry.value, entry.time)
