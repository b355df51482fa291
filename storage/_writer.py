"""The single writer: one thread, one connection, group commit.

The event loop hands the writer a whole batch of commands at once (one thread
hop); the writer runs them in one ``BEGIN IMMEDIATE`` transaction, each under
its own SAVEPOINT so a conflicting command rolls back alone, COMMITs once, and
hands every outcome back in one ``call_soon_threadsafe`` (one hop back). While
a batch commits, new commands queue up on the loop side and form the next
batch, so the commit cost is shared by every producer waiting at that moment.

This is a plain owned thread rather than a pykka actor: it needs exactly one
mailbox message kind (a batch), a join-able thread for an orderly close, and
nothing else pykka offers.

Savepoints are the slow path. Each SQL statement is a GIL hand-off for this
thread (sqlite3 releases the GIL around every step, and re-taking it waits for
whatever Python the loop thread is running), so a batch is first run without
any: if every command succeeds it COMMITs as it is. When one fails, the whole
transaction is rolled back, the in-memory state restored, and the batch run
again with a SAVEPOINT per command, so the failed ones roll back alone. Only
the second run's outcomes are handed back.

The writer keeps in memory the latest seq of each aggregate it has touched,
the next global position, and the ``session_lease`` rows it has read or
written (it is the only writer: a file lock keeps other processes out, so a
lease row changes only through it), so a fenced append checks its lease
without a SELECT. Every change to that state is recorded in an undo list, so
a rolled-back command (or batch) restores exactly those entries, whatever the
number of sessions; a failed COMMIT drops both caches, which reload lazily.

Statements are grouped in the first (savepoint-free) run of a batch: the
batch's event rows go in one ``executemany`` (nothing a projector reads or
writes refers to the ``event`` table; they are written before anything that
reads it), and consecutive projection ops of the same statement text go in
one ``executemany`` too (:class:`_Grouped`), in their order. An op whose row
count is checked joins a group only when its statement cannot touch more than
one row (:func:`_one_row`), so "the group touched as many rows as it has ops"
means each touched its one; when a group falls short, the batch runs again
with savepoints, statement by statement, and the op at fault fails its own
command as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import orjson

from storage._ops import NO_STAGED_REVERT, TOUCH, TOUCH_UNLESS_REVERTED, Op
from storage._replay import mismatched, refusal, stored_replay
from storage.batch import Outcome, Prepared
from storage.clock import SYSTEM, Clock
from storage.errors import AppendConflictError, StorageBrokenError, StoreLockedError
from storage.lease import LeaseRow, LeaseUse, use_lease
from storage.projectors import project
from storage.recorder import Command, NewEvent, RecordedEvent
from storage.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["Synchronous", "Writer", "migrate", "shared_lock"]

Synchronous = Literal["FULL", "NORMAL"]

_STORED: Final = "SELECT position, aggregate_id, seq, type, created, data FROM event WHERE id = ?"
_INSERT_EVENT: Final = (
    "INSERT INTO event (position, id, aggregate_id, seq, type, created, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


Batch = list[Prepared]
Done = Callable[[list[Outcome]], None]

#: (cache, key, value before): what restores one in-memory change.
Undo = list[tuple[dict[str, Any], str, Any]]
#: An ``event_fence`` row: position, session, host, epoch.
Fence = tuple[int, str, str, int]
_MISSING: Final = object()

# Both caches are bounded by count, trimmed (oldest entries first) between
# batches: an entry is some 200 bytes, so a few MB at most. A dropped entry
# reloads with one indexed SELECT.
_SEQ_ENTRIES: Final = 16_384
_LEASE_ENTRIES: Final = 16_384


class Writer:
    def __init__(
        self,
        path: str,
        *,
        synchronous: Synchronous,
        loop: asyncio.AbstractEventLoop,
        on_done: Done,
        clock: Clock = SYSTEM,
    ) -> None:
        self._path = path
        self._clock = clock
        self._synchronous = synchronous
        self._loop = loop
        self._on_done = on_done
        self._inbox: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._exited: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(target=self._run, name=f"sessionrt-writer:{path}")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._seqs: dict[str, int] = {}
        self._leases: dict[str, LeaseRow] = {}
        self._position = 0
        #: Statements held back to run grouped; None while a batch runs with savepoints.
        self._grouped: _Grouped | None = None

    # -- loop side ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._thread.start()
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            await self.stop()
            raise

    def submit(self, batch: Batch) -> None:
        self._inbox.put(batch)

    async def stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(None)
            await asyncio.shield(self._exited)
            # The thread signalled from its last line; this join waits for no work.
            self._thread.join()

    def _signal(self, fn: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(fn)

    # -- writer thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as exc:
            error = exc
            self._signal(lambda: _settle(self._ready, error))
            self._close()
            self._signal(lambda: _settle(self._exited, None))
            return
        self._signal(lambda: _settle(self._ready, None))
        try:
            while (batch := self._inbox.get()) is not None:
                try:
                    outcomes = self._commit(batch)
                except Exception as exc:
                    # Never leave appenders waiting on a writer that is gone.
                    broken = StorageBrokenError(f"writer failed: {exc!r}")
                    outcomes = [Outcome(error=broken) for _ in batch]
                self._signal(lambda o=outcomes: self._on_done(o))  # type: ignore[misc]
        finally:
            self._close()
            self._signal(lambda: _settle(self._exited, None))

    def _open(self) -> None:
        fd = os.open(_lock_path(self._path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(f"another process is writing {self._path}") from None
        self._lock_fd = fd
        try:
            conn = sqlite3.connect(self._path, isolation_level=None)
            self._conn = conn
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA busy_timeout = 5000")
            migrate(conn)
            # This process holds the only writer lock: every lease still live
            # belongs to a process that is gone, so none is waited out.
            conn.execute("UPDATE session_lease SET expires = 0 WHERE expires > 0")
            row = conn.execute("SELECT coalesce(max(position), 0) FROM event").fetchone()
            self._position = int(row[0])
        except sqlite3.Error as exc:
            raise StorageBrokenError(f"cannot open {self._path}: {exc}") from exc

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _commit(self, batch: Batch) -> list[Outcome]:
        conn = self._conn
        assert conn is not None
        _trim(self._seqs, _SEQ_ENTRIES)
        _trim(self._leases, _LEASE_ENTRIES)
        position_before = self._position
        try:
            conn.execute("BEGIN IMMEDIATE")
            outcomes = self._apply_all(conn, batch)
            if outcomes is None:
                # A command failed and its partial writes are in the
                # transaction: start over, each command in its own savepoint.
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                outcomes = [self._apply(conn, prepared) for prepared in batch]
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._seqs.clear()
            self._leases.clear()
            self._position = position_before
            broken = StorageBrokenError(f"commit failed: {exc}")
            return [Outcome(error=broken) for _ in batch]
        return outcomes

    def _apply_all(self, conn: sqlite3.Connection, batch: Batch) -> list[Outcome] | None:
        """Every command's outcome, without savepoints; None (state restored) if one failed."""
        position_before = self._position
        undo: Undo = []
        outcomes = []
        fences: list[Fence] = []
        self._grouped = grouped = _Grouped()
        try:
            for prepared in batch:
                outcomes.append(self._perform(conn, prepared, undo, fences))
            grouped.run(conn)
            _insert_fences(conn, fences)
        except sqlite3.IntegrityError:
            pass
        except sqlite3.Error:
            raise  # the database itself failed: the whole batch fails (see _commit)
        except Exception:
            pass  # the savepoint run below reports it on its own command
        else:
            return outcomes
        finally:
            self._grouped = None
        self._restore(undo, position_before)
        return None

    def _seq(self, conn: sqlite3.Connection, aggregate_id: str) -> int:
        seq = self._seqs.get(aggregate_id)
        if seq is None:
            row = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM event WHERE aggregate_id = ?", (aggregate_id,)
            ).fetchone()
            seq = self._seqs[aggregate_id] = int(row[0])
        return seq

    def _apply(self, conn: sqlite3.Connection, prepared: Prepared) -> Outcome:
        """One command under its own savepoint: a failure rolls back only it."""
        position_before = self._position
        undo: Undo = []
        conn.execute("SAVEPOINT command")
        try:
            fences: list[Fence] = []
            outcome = self._perform(conn, prepared, undo, fences)
            _insert_fences(conn, fences)
            conn.execute("RELEASE command")
            return outcome
        except sqlite3.IntegrityError as exc:
            self._undo(conn, undo, position_before)
            return Outcome(error=AppendConflictError(f"constraint violated: {exc}"))
        except sqlite3.Error:
            raise  # the database itself failed: the whole batch fails (see _commit)
        except Exception as exc:
            # A conflict, or a bug in a projector: it fails its own command
            # instead of taking the batch, or the writer thread, down with it.
            self._undo(conn, undo, position_before)
            return Outcome(error=exc)

    def _perform(
        self, conn: sqlite3.Connection, prepared: Prepared, undo: Undo, fences: list[Fence]
    ) -> Outcome:
        """Apply one command in the open transaction; raise if it is refused.

        Its ``event_fence`` rows go to ``fences``, for the caller to insert
        with the others of its run (one statement instead of one per event).
        """
        command = prepared.command
        fence = None
        if command.lease is not None:
            fence = (command.lease, self._use_lease(conn, command.lease, undo))
        replay = self._check_expected(conn, prepared)
        if replay is not None:
            return Outcome(records=replay, publish=False)
        grouped = self._grouped
        if grouped is not None:
            # Held back in order with the projection ops, so a check still runs
            # after the ops before it (what it reads), not at once with the event
            # rows flushed for it: checks read projection rows, never ``event``
            # (Command.checks). A check that fails fails the grouped run; the
            # savepoint run then executes it on its own and names its conflict.
            for check in command.checks:
                grouped.add(conn, check)
        else:
            for check in command.checks:
                cursor = conn.execute(check.sql, check.params)
                if check.expect is not None and cursor.rowcount != check.expect:
                    raise check.conflict()
        records = self._insert(conn, command.events, prepared.encoded, undo, fence, fences)
        if command.blobs or command.entries:
            if self._grouped is not None:
                self._grouped.run(conn)
            _write_side(conn, command)
        return Outcome(records=records)

    def _undo(self, conn: sqlite3.Connection, undo: Undo, position: int) -> None:
        conn.execute("ROLLBACK TO command")
        conn.execute("RELEASE command")
        self._restore(undo, position)

    def _restore(self, undo: Undo, position: int) -> None:
        for cache, key, before in reversed(undo):
            if before is _MISSING:
                cache.pop(key, None)
            else:
                cache[key] = before
        self._position = position

    def _check_expected(
        self, conn: sqlite3.Connection, prepared: Prepared
    ) -> list[RecordedEvent] | None:
        """Raise on a seq mismatch; return stored records for an exact replay."""
        if not prepared.command.expected:
            return None
        mismatches = mismatched(prepared, lambda agg: self._seq(conn, agg))
        if not mismatches:
            return None
        if self._grouped is not None:
            self._grouped.run(conn)  # the event rows held back, for the lookup by id
        stored = stored_replay(prepared, lambda id_: conn.execute(_STORED, (id_,)).fetchone())
        if stored is not None:
            return stored
        raise refusal(mismatches)

    def _insert(
        self,
        conn: sqlite3.Connection,
        events: Sequence[NewEvent],
        encoded: Sequence[tuple[str, str]],
        undo: Undo,
        fence: tuple[LeaseUse, int] | None,
        fences: list[Fence],
    ) -> list[RecordedEvent]:
        """Store the events and their projections; with ``fence`` (the lease
        used and its epoch), also who wrote the lease's session's events: the
        appender's copies of those carry the epoch."""
        fenced, host, epoch = (
            (None, "", None) if fence is None else (fence[0].session_id, fence[0].host_id, fence[1])
        )
        seqs = self._seqs
        grouped = self._grouped
        records = []
        for new, (type_, data) in zip(events, encoded, strict=True):
            agg = new.aggregate_id
            undo.append((seqs, agg, seqs.get(agg, _MISSING)))
            seq = self._seq(conn, agg) + 1
            seqs[agg] = seq
            self._position += 1
            record = RecordedEvent(
                position=self._position,
                id=new.id,
                aggregate_id=agg,
                seq=seq,
                type=type_,
                created=new.created,
                data=data,
                event=new.event,
                epoch=epoch if agg == fenced else None,
            )
            records.append(record)
            row = (self._position, new.id, agg, seq, type_, new.created, data)
            if grouped is None:
                conn.execute(_INSERT_EVENT, row)
            else:
                grouped.events.append(row)
            if agg == fenced and epoch is not None:
                fences.append((self._position, agg, host, epoch))
        for record in records:
            for op in project(record):
                if grouped is not None:
                    grouped.add(conn, op)
                    continue
                cursor = conn.execute(op.sql, op.params)
                if op.expect is not None and cursor.rowcount != op.expect:
                    raise op.conflict()
        return records

    def _lease(self, conn: sqlite3.Connection, session_id: str) -> LeaseRow:
        """``session_id``'s lease row, from memory when this writer has seen it."""
        leases = self._leases
        if session_id in leases:
            return leases[session_id]
        row = conn.execute(_READ_LEASE, (session_id,)).fetchone()
        held: LeaseRow = None if row is None else (str(row[0]), int(row[1]), int(row[2]))
        # What the database says is true before and after this command: no undo.
        leases[session_id] = held
        return held

    def _set_lease(self, session_id: str, row: LeaseRow, undo: Undo) -> None:
        undo.append((self._leases, session_id, self._leases.get(session_id, _MISSING)))
        self._leases[session_id] = row

    def _use_lease(self, conn: sqlite3.Connection, use: LeaseUse, undo: Undo) -> int:
        """Take, check, renew or release ``use``'s lease (:func:`storage.lease.use_lease`);
        the epoch the command holds.

        Raises :class:`LeaseHeldError` or :class:`FencedError`; the caller rolls
        the command back either way. The clock is this writer's (its ``clock``): on
        SQLite every host is this one process.
        """
        held = self._lease(conn, use.session_id)
        row, epoch = use_lease(held, use, self._clock.now_ms())
        if row != held and row is not None:
            conn.execute(_WRITE_LEASE, (use.session_id, *row))
            self._set_lease(use.session_id, row, undo)
        return epoch


_INSERT_BLOB: Final = "INSERT OR IGNORE INTO instruction_blob (hash, value) VALUES (?, ?)"
_UPSERT_ENTRY: Final = (
    "INSERT INTO instruction_entry (session_id, key, value, removed, time_created, time_updated)"
    " VALUES (?, ?, ?, 0, ?, ?)"
    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value, removed = 0,"
    " time_updated = excluded.time_updated WHERE value IS NOT excluded.value OR removed <> 0"
)
_REMOVE_ENTRY: Final = (
    "UPDATE instruction_entry SET value = NULL, removed = 1, time_updated = ?"
    " WHERE session_id = ? AND key = ? AND removed = 0"
)


class _Grouped:
    """Event rows and a run of same-text projection ops, held back to run grouped.

    The event rows go in one ``executemany`` at :meth:`run`; the ops run in
    order, a run of consecutive ops with one statement text (and one row-count
    expectation) as one ``executemany``.
    """

    __slots__ = ("events", "expect", "ops", "params", "sql")

    def __init__(self) -> None:
        self.events: list[tuple[int, str, str, int, str, int, str]] = []
        self.sql: str | None = None
        self.expect: int | None = None
        self.params: list[tuple[Any, ...]] = []
        self.ops: list[Op] = []

    def add(self, conn: sqlite3.Connection, op: Op) -> None:
        if op.sql == TOUCH and len(self.ops) == 1:
            held = self.ops[0]
            if held.sql == NO_STAGED_REVERT and held.params[0] == op.params[1]:
                # A prompt's check, then its event's touch of the same row: one
                # statement (TOUCH_UNLESS_REVERTED). Falling short, it fails the
                # grouped run; the savepoint run tells which of the two refused.
                folded = Op(
                    TOUCH_UNLESS_REVERTED,
                    op.params,
                    expect=1,
                    reason=held.reason,
                    subject=held.subject,
                )
                self.sql, self.expect = folded.sql, folded.expect
                self.ops, self.params = [folded], [folded.params]
                return
        if op.sql != self.sql or op.expect != self.expect or not _groupable(op):
            self._run_ops(conn)
            self.sql, self.expect = op.sql, op.expect
        self.params.append(op.params)
        self.ops.append(op)

    def run(self, conn: sqlite3.Connection) -> None:
        """Run everything held back."""
        if self.events:
            conn.executemany(_INSERT_EVENT, self.events)
            self.events.clear()
        self._run_ops(conn)

    def _run_ops(self, conn: sqlite3.Connection) -> None:
        ops = self.ops
        if not ops:
            return
        first = ops[0]
        if len(ops) == 1:
            rowcount = conn.execute(first.sql, first.params).rowcount
        else:
            rowcount = conn.executemany(first.sql, self.params).rowcount
        if first.expect is not None and rowcount != first.expect * len(ops):
            # Which op fell short is for the savepoint run to tell.
            raise first.conflict()
        self.sql, self.expect = None, None
        self.params = []
        self.ops = []


#: Statements that touch at most one row: by the primary key ``id`` of a table
#: keyed by it, or an INSERT of one VALUES row.
_ONE_ROW: Final = re.compile(
    r"(?:UPDATE (?:session|session_message|session_inbox|session_permission) SET .+"
    r"|DELETE FROM (?:session|session_message|session_inbox|session_permission))"
    r" WHERE id = \?(?: AND .*)?"
    r"|INSERT (?:OR IGNORE )?INTO \w+ \([^()]*\) VALUES \([?, ]*\)(?: ON CONFLICT .*)?",
    re.DOTALL,
)
#: Each statement seen: whether it touches at most one row. Bounded by the
#: projectors' statement texts, which are constants (capped all the same).
_ONE_ROW_SEEN: Final[dict[str, bool]] = {}


def _one_row(sql: str) -> bool:
    seen = _ONE_ROW_SEEN.get(sql)
    if seen is None:
        seen = _ONE_ROW.fullmatch(sql) is not None and "SELECT" not in sql
        if len(_ONE_ROW_SEEN) < 1024:
            _ONE_ROW_SEEN[sql] = seen
    return seen


def _groupable(op: Op) -> bool:
    """Whether ``op`` may join others of its text: unchecked, or one row at most."""
    return op.expect is None or (op.expect == 1 and _one_row(op.sql))


def _write_side(conn: sqlite3.Connection, command: Command) -> None:
    """The command's non-event rows: blobs (insert-or-ignore) and entries."""
    if command.blobs:
        conn.executemany(_INSERT_BLOB, command.blobs.items())
    for entry in command.entries:
        if entry.removed:
            conn.execute(_REMOVE_ENTRY, (entry.time, entry.session_id, entry.key))
        else:
            conn.execute(
                _UPSERT_ENTRY, (entry.session_id, entry.key, entry.value, entry.time, entry.time)
            )


_WRITE_LEASE: Final = (
    "INSERT INTO session_lease (session_id, host_id, epoch, expires) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (session_id) DO UPDATE SET host_id = excluded.host_id,"
    " epoch = excluded.epoch, expires = excluded.expires"
)
_READ_LEASE: Final = "SELECT host_id, epoch, expires FROM session_lease WHERE session_id = ?"
#: Every fence row of a run from one parameter, a JSON array of rows: one
#: statement text, prepared once (a VALUES list per row count was a new
#: statement to parse at nearly every batch).
_INSERT_FENCES: Final = (
    "INSERT INTO event_fence (position, session_id, host_id, epoch)"
    " SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),"
    " json_extract(value, '$[2]'), json_extract(value, '$[3]') FROM json_each(?)"
)


def _insert_fences(conn: sqlite3.Connection, rows: Sequence[Fence]) -> None:
    """Insert ``rows`` with one statement.

    An execution's events are nearly all fenced; a statement each (and a
    GIL hand-off each, for this thread) was a quarter of the writer's
    statements with 100 sessions stepping.
    """
    if rows:
        conn.execute(_INSERT_FENCES, (orjson.dumps(rows).decode(),))


def _trim(cache: dict[str, Any], limit: int) -> None:
    """Drop the oldest entries beyond ``limit`` (only between batches: no undo refers to them)."""
    if len(cache) > limit:
        for key in list(itertools.islice(cache, len(cache) - limit)):
            del cache[key]


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _lock_path(path: str) -> str:
    return path + ".lock"


def shared_lock(path: str) -> int | None:
    """Hold off writers while a read-only store is open; the fd to close, or None.

    Raises :class:`StoreLockedError` when a writer holds the database now. No
    lock file means no writer ever opened it; nothing is created for a reader.
    """
    try:
        fd = os.open(_lock_path(path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(f"another process is writing {path}") from None
    return fd


def migrate(conn: sqlite3.Connection) -> int:
    """Bring ``conn``'s database to :data:`~storage.schema.SCHEMA_VERSION` (the
    migrations of :mod:`storage.schema`); return the version found.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    found = 0 if row is None else int(row[0])
    if found > SCHEMA_VERSION:
        raise StorageBrokenError(
            f"database schema version {found} is newer than this build ({SCHEMA_VERSION})"
        )
    for version in range(found + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # executescript() would COMMIT on its own; statement by statement
            # keeps each migration atomic.
            for statement in MIGRATIONS[version - 1].script("sqlite").split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found
