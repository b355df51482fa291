"""One batch of commands, committed on PostgreSQL in one transaction.

The semantics are SQLite's (:mod:`storage._writer`): seq from 1 without gaps
per aggregate, an exact replay idempotent, projections in the event's own
transaction, one command's failure failing that command alone. What differs
is that several processes, on several hosts, may write one database:

- Every batch takes one transaction-scoped advisory lock (:data:`LOG_LOCK`)
  first, so batches commit one at a time across all writers. That is what
  makes ``seq`` safe (each event's is its aggregate's head plus one, read
  under the lock; ``UNIQUE (aggregate_id, seq)`` is the backstop), lets the
  lease rows be read once and decided in Python (only batches write them),
  and makes ``position`` follow commit order: a batch takes its positions
  from the sequence as one block under the lock, so once ``position = p`` is
  visible, every smaller position is visible too or never will be, and
  ``read_all(after)`` never skips an event that commits later.
- The batch NOTIFYs its commit in the same transaction (delivered only if it
  commits), only while a process of another origin listens
  (:mod:`.listeners`, read under the lock): see :mod:`.notify`.
- A writer that expects another batch right away (``chain``) ends the batch
  with ``COMMIT; BEGIN`` and the lock in one round trip, so the next batch
  starts under the lock without a round trip of its own (``begun``); the
  store gives the lock back at once when nothing came (see
  :meth:`~storage.postgres.store.PostgresStore._write_loop`). Every
  statement of that next batch still runs after the lock was taken.

A batch is plain statements, in this order:

1. BEGIN and the lock, in one round trip (:data:`_BEGIN`); every statement
   after it sees every batch committed before.
2. Only when a command expects seqs or uses a lease, :data:`_READ`: the
   heads it expects, the lease rows, the server's clock.
3. Python decides each command in order (:meth:`_Batch.decide`): its lease
   (:func:`storage.lease.use_lease`) and its expected seqs (a mismatch is a
   refusal, or an exact replay whose stored records are read then). A
   command refused here fails alone and writes nothing.
4. :func:`_write`: the events in one statement (:data:`INSERT_EVENTS`: it
   takes the block of positions and each event's seq, and says whether
   another origin listens); then every record's projector ops, with the
   commands' checks, instruction blobs and entries, grouped into runs of
   one statement (:func:`.runs.runs`), one ``executemany`` per run; the changed
   lease rows; the fences. Then the NOTIFY, and COMMIT.

What only the server can see (a constraint, an op touching other than its
``expect`` rows), or a projector raising, rolls that transaction back, and
the batch runs again with a SAVEPOINT around each command's writes
(``isolate``), so the command that fails rolls back alone and the others
commit, as on SQLite. Positions skipped that way are gaps.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import Final

import asyncpg
import attrs

from storage._ops import Op
from storage._replay import StoredRow, mismatched, refusal, stored_replay
from storage.batch import Outcome, Prepared, keys
from storage.errors import AppendConflictError, StorageBrokenError
from storage.lease import LeaseRow, use_lease
from storage.postgres.listeners import others_listen
from storage.postgres.notify import payloads
from storage.postgres.runs import run_ops, runs
from storage.projectors import project
from storage.recorder import Command, RecordedEvent

__all__ = ["INSERT_EVENTS", "LOG_LOCK", "BatchResult", "commit_batch"]

#: Key of the advisory lock every batch holds until its COMMIT ("sesslog\0").
LOG_LOCK: Final = 0x7365_7373_6C6F_6700

#: One simple query, so no parameter: the key is this module's constant.
_BEGIN: Final = f"BEGIN; SELECT pg_advisory_xact_lock({LOG_LOCK})"
#: A batch's COMMIT and the next one's BEGIN with the lock, in one round trip.
_COMMIT_BEGIN: Final = f"COMMIT; {_BEGIN}"
_NOW: Final = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
#: $1 the aggregates the batch expects, $2 the sessions of its leases.
_READ: Final = (
    f"SELECT {_NOW},"
    " ARRAY(SELECT (a, coalesce((SELECT max(seq) FROM event WHERE aggregate_id = a), 0))"
    " FROM unnest($1::text[]) AS a),"
    " ARRAY(SELECT (session_id, host_id, epoch, expires) FROM session_lease"
    " WHERE session_id = ANY($2::text[]))"
)
#: $1 how many events, $2.. each event's id, aggregate, its place among the
#: statement's events of its aggregate (1, 2 …), type, created, data; $8 the
#: batch's origin. The block of positions is taken once (a CTE with a volatile
#: function runs once), each row gets its place in it, and each seq is its
#: aggregate's head plus its place (the statement does not see its own rows).
INSERT_EVENTS: Final = (
    "WITH block AS (SELECT setval('event_position', nextval('event_position') + $1 - 1) AS last)"
    " INSERT INTO event (position, id, aggregate_id, seq, type, created, data)"
    " SELECT block.last - $1 + u.i, u.id, u.agg,"
    " coalesce((SELECT max(seq) FROM event WHERE aggregate_id = u.agg), 0) + u.k,"
    " u.type, u.created, u.data"
    " FROM block, unnest($2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],"
    " $7::text[]) WITH ORDINALITY AS u(id, agg, k, type, created, data, i)"
    f" RETURNING id, position, seq, {others_listen('$8')}"
)
_STORED: Final = (
    "SELECT id, position, aggregate_id, seq, type, created, data FROM event"
    " WHERE id = ANY($1::text[])"
)
_WRITE_LEASES: Final = (
    "INSERT INTO session_lease (session_id, host_id, epoch, expires)"
    " SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])"
    " ON CONFLICT (session_id) DO UPDATE SET host_id = excluded.host_id,"
    " epoch = excluded.epoch, expires = excluded.expires"
)
_INSERT_FENCES: Final = (
    "INSERT INTO event_fence (position, session_id, host_id, epoch)"
    " SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[])"
)
_NOTIFY: Final = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"

# The instruction rows a command writes besides its events, as ops.
_INSERT_BLOB: Final = (
    "INSERT INTO instruction_blob (hash, value) VALUES (?, ?) ON CONFLICT (hash) DO NOTHING"
)
_UPSERT_ENTRY: Final = (
    "INSERT INTO instruction_entry (session_id, key, value, removed, time_created, time_updated)"
    " VALUES (?, ?, ?, 0, ?, ?)"
    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value, removed = 0,"
    " time_updated = excluded.time_updated"
    " WHERE instruction_entry.value IS DISTINCT FROM excluded.value"
    " OR instruction_entry.removed <> 0"
)
_REMOVE_ENTRY: Final = (
    "UPDATE instruction_entry SET value = NULL, removed = 1, time_updated = ?"
    " WHERE session_id = ? AND key = ? AND removed = 0"
)

#: SQLSTATE classes that fail one command (bad data, a constraint), not the batch.
_COMMAND_CLASSES: Final = ("22", "23")


@attrs.frozen
class BatchResult:
    """Outcomes in batch order, and the records the batch published (committed, not replays)."""

    outcomes: list[Outcome]
    published: list[RecordedEvent]
    #: Committed by the run with a SAVEPOINT per command (a command failed
    #: where only the server could see it).
    isolated: bool
    #: The connection is left in a new transaction holding the lock (``chain``).
    chained: bool = False


async def commit_batch(
    conn: asyncpg.Connection,
    batch: Sequence[Prepared],
    *,
    channel: str,
    origin: str,
    own: Callable[[int, int], None],
    isolate: bool = False,
    begun: bool = False,
    chain: bool = False,
) -> BatchResult:
    """Commit ``batch`` in one transaction; raise only if the batch as a whole failed.

    The batch NOTIFYs ``channel`` with ``origin``'s payloads; ``own`` is told
    the positions it published before COMMIT (a catch-up racing the commit
    skips them too). ``isolate`` runs a command at a time from the start
    (tests compare the two runs). ``begun``: ``conn`` is already in a
    transaction holding the lock (an earlier batch's ``chain``). ``chain``:
    leave ``conn`` in a new transaction holding the lock
    (:attr:`BatchResult.chained` says whether it is). Any exception is the
    connection's, whose state is then unknown: the caller replaces it.
    """
    for one_at_a_time in (True,) if isolate else (False, True):
        if begun:
            begun = False  # a redo begins again
        else:
            await conn.execute(_BEGIN)
        try:
            result = await _commit(conn, batch, channel, origin, own, isolate=one_at_a_time)
        except _Redo:
            await conn.execute("ROLLBACK")
            continue  # again, a command at a time
        except BaseException as exc:
            if isinstance(exc, Exception) and not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
            else:
                conn.terminate()  # cut off mid-statement: its state is unknown
            raise
        if not chain:
            await conn.execute("COMMIT")
            return result
        return attrs.evolve(result, chained=await _commit_begin(conn))
    raise AssertionError("the isolated run never asks to be redone")


async def _commit_begin(conn: asyncpg.Connection) -> bool:
    """COMMIT, then BEGIN and the lock; whether the new transaction holds it.
    Raises only if the COMMIT failed."""
    try:
        await conn.execute(_COMMIT_BEGIN)
    except Exception:
        # A failed COMMIT ends the transaction; a failure after it leaves the
        # new one open (aborted): the batch is in, the next begins afresh.
        if conn.is_closed() or not conn.is_in_transaction():
            raise
        await conn.execute("ROLLBACK")
        return False
    return True


async def _commit(
    conn: asyncpg.Connection,
    batch: Sequence[Prepared],
    channel: str,
    origin: str,
    own: Callable[[int, int], None],
    *,
    isolate: bool,
) -> BatchResult:
    """The batch in the open transaction; raises :class:`_Redo` when the plain run
    meets what only a command at a time can settle."""
    state = await _Batch.read(conn, batch)
    decisions: list[_Decided | Outcome] = []
    others = False
    for prepared in batch:
        decided = await state.decide(prepared, conn if isolate else None)
        if isinstance(decided, _Decided) and isolate:
            await conn.execute("SAVEPOINT command")
            try:
                others |= await _write(conn, [decided], origin)
            except _Refused as refused:
                await conn.execute("ROLLBACK TO SAVEPOINT command")
                decided = Outcome(error=refused.error)
            else:
                await conn.execute("RELEASE SAVEPOINT command")
        if isinstance(decided, _Decided):
            state.keep(decided)
        decisions.append(decided)
    kept = [d for d in decisions if isinstance(d, _Decided)]
    if not isolate:
        others = await _write(conn, kept, origin)
    published = [r for d in kept for r in d.records]
    if published:
        own(published[0].position, published[-1].position)
        if others:
            await conn.execute(_NOTIFY, channel, payloads(origin, published))
    outcomes = [d.outcome if isinstance(d, _Decided) else d for d in decisions]
    return BatchResult(outcomes, published, isolate)


class _Decided:
    """A command decided in Python, and what it writes (its records, once written)."""

    __slots__ = ("command", "encoded", "fenced", "keys", "lease", "records", "replay")

    def __init__(
        self,
        prepared: Prepared,
        lease: tuple[str, LeaseRow, int] | None,
        replay: list[RecordedEvent] | None = None,
    ) -> None:
        self.command = prepared.command
        self.encoded = prepared.encoded
        self.keys = keys(prepared)
        #: The lease's session, its row as the command leaves it, the epoch it holds.
        self.lease = lease
        #: Whose events are fenced: the lease's session (None: no lease).
        self.fenced = None if lease is None else lease[0]
        #: An exact replay's stored records: it writes only its lease use, which
        #: stands as on SQLite (the lease is not part of the log).
        self.replay = replay
        #: What it appended, once :func:`_write` has written it.
        self.records: list[RecordedEvent] = []

    @property
    def outcome(self) -> Outcome:
        if self.replay is not None:
            return Outcome(records=self.replay, publish=False)
        return Outcome(records=self.records)

    def ops(self) -> list[Op]:
        """Its checks, its records' projections, its instruction rows: in that order."""
        command = self.command
        ops = [*command.checks, *(op for r in self.records for op in project(r))]
        ops += [Op(_INSERT_BLOB, (h, v)) for h, v in command.blobs.items()]
        for entry in command.entries:
            if entry.removed:
                ops.append(Op(_REMOVE_ENTRY, (entry.time, entry.session_id, entry.key)))
            else:
                values = (entry.session_id, entry.key, entry.value, entry.time, entry.time)
                ops.append(Op(_UPSERT_ENTRY, values))
        return ops


class _Batch:
    """What the batch's commands are decided against: read under the lock, then
    moved by each command kept."""

    def __init__(self, now: int, heads: dict[str, int], leases: dict[str, LeaseRow]) -> None:
        self.now = now
        #: The heads of the aggregates some command expects.
        self.heads = heads
        self.leases = leases

    @classmethod
    async def read(cls, conn: asyncpg.Connection, batch: Sequence[Prepared]) -> _Batch:
        expected = sorted({agg for p in batch for agg in p.command.expected or ()})
        leased = sorted({p.command.lease.session_id for p in batch if p.command.lease})
        if not (expected or leased):
            return cls(0, {}, {})
        now, heads, leases = await conn.fetchrow(_READ, expected, leased)
        return cls(
            int(now),
            {a: int(seq) for a, seq in heads},
            {s: (h, int(e), int(x)) for s, h, e, x in leases},
        )

    async def decide(
        self, prepared: Prepared, conn: asyncpg.Connection | None
    ) -> _Decided | Outcome:
        """``prepared`` to write, or its outcome when it writes nothing (a refusal).
        Changes nothing here: :meth:`keep` does, once it is in.

        A seq mismatch is a conflict or an exact replay, which only the stored
        events tell apart, those of this batch's earlier commands included:
        without ``conn`` (the plain run, which writes after deciding) it
        raises :class:`_Redo`.
        """
        command = prepared.command
        lease = None
        try:
            if command.lease is not None:
                sid = command.lease.session_id
                row, epoch = use_lease(self.leases.get(sid), command.lease, self.now)
                lease = (sid, row, epoch)
            if command.expected and (mismatches := mismatched(prepared, self.heads.__getitem__)):
                if conn is None:
                    raise _Redo
                replay = stored_replay(prepared, (await _stored(conn, command)).get)
                if replay is None:
                    raise refusal(mismatches)
                return _Decided(prepared, lease, replay)
        except AppendConflictError as exc:
            return Outcome(error=exc)
        return _Decided(prepared, lease)

    def keep(self, decided: _Decided) -> None:
        """``decided`` is in: later commands see its heads and its lease."""
        if decided.replay is None:
            for new in decided.command.events:
                if new.aggregate_id in self.heads:
                    self.heads[new.aggregate_id] += 1
        if decided.lease is not None:
            self.leases[decided.lease[0]] = decided.lease[1]


async def _stored(conn: asyncpg.Connection, command: Command) -> dict[str, StoredRow]:
    rows = await conn.fetch(_STORED, [new.id for new in command.events])
    return {r[0]: (r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows}


class _Redo(Exception):
    """The plain run met what only a command at a time can settle: roll back, isolate."""


class _Refused(_Redo):
    """A write failed for a reason that is its command's (see :func:`_write`)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def _write(conn: asyncpg.Connection, decided: Sequence[_Decided], origin: str) -> bool:
    """Write the commands' events (each gets its records), ops, lease rows and
    fences, a statement per kind (and per run of ops); whether another origin
    listens (False when nothing was appended).

    Raises :class:`_Refused` for a failure that is the commands' own (data the
    server refuses, a constraint, an op's row count, a projector raising); any
    other error is the batch's.
    """
    try:
        others = await _insert(conn, decided, origin)
        try:
            ops = [(d.keys, op) for d in decided for op in d.ops()]
        except Exception as exc:
            raise _Refused(exc) from exc  # a bug in a projector: its command fails
        for run in runs(ops):
            if (refused := await run_ops(conn, run)) is not None:
                raise _Refused(refused.conflict())
        leases = {d.lease[0]: d.lease[1] for d in decided if d.lease is not None}
        if rows := [(sid, *row) for sid, row in leases.items() if row is not None]:
            await conn.execute(_WRITE_LEASES, *map(list, zip(*rows, strict=True)))
        fences = [
            (r.position, r.aggregate_id, d.command.lease.host_id, r.epoch)
            for d in decided
            if d.command.lease is not None
            for r in d.records
            if r.epoch is not None
        ]
        if fences:
            await conn.execute(_INSERT_FENCES, *map(list, zip(*fences, strict=True)))
    except asyncpg.PostgresError as exc:
        state = exc.sqlstate or ""
        if not state.startswith(_COMMAND_CLASSES):
            raise  # the database failed: the whole batch fails
        message = str(getattr(exc, "message", None) or exc)
        if state.startswith("23"):
            raise _Refused(AppendConflictError(f"constraint violated: {message}")) from None
        raise _Refused(StorageBrokenError(f"the database refused the data: {message}")) from None
    return others


async def _insert(conn: asyncpg.Connection, decided: Sequence[_Decided], origin: str) -> bool:
    """The events of ``decided`` in one statement; each gets its records."""
    ids, aggs, places, types, created, data = [], [], [], [], [], []
    placed: collections.Counter[str] = collections.Counter()
    for d in decided:
        if d.replay is not None:
            continue
        for new, (type_, text) in zip(d.command.events, d.encoded, strict=True):
            placed[new.aggregate_id] += 1
            ids.append(new.id)
            aggs.append(new.aggregate_id)
            places.append(placed[new.aggregate_id])
            types.append(type_)
            created.append(new.created)
            data.append(text)
    if not ids:
        return False
    rows = await conn.fetch(
        INSERT_EVENTS, len(ids), ids, aggs, places, types, created, data, origin
    )
    # Each row names its event: RETURNING's order is the insert's, which SQL leaves open.
    stored = {r[0]: (r[1], r[2]) for r in rows}
    for d in decided:
        if d.replay is not None:
            continue
        epoch = None if d.lease is None else d.lease[2]
        for new, (type_, text) in zip(d.command.events, d.encoded, strict=True):
            position, seq = stored[new.id]
            d.records.append(
                RecordedEvent(
                    position=position,
                    id=new.id,
                    aggregate_id=new.aggregate_id,
                    seq=seq,
                    type=type_,
                    created=new.created,
                    data=text,
                    event=new.event,
                    epoch=epoch if new.aggregate_id == d.fenced else None,
                )
            )
    return bool(rows[0][3])
