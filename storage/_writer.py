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

The writer keeps the latest seq of each aggregate it has touched and the next
global position in memory (it is the only writer: a file lock keeps other
processes out). Each command records what it changed in an undo list, so a
rolled-back SAVEPOINT restores exactly those entries, whatever the number of
sessions; a failed COMMIT drops the whole cache, which then reloads lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, Literal

import attrs

from storage import schema
from storage._replay import mismatched, refusal, stored_replay
from storage.errors import (
    AppendConflictError,
    FencedError,
    LeaseHeldError,
    StorageBrokenError,
    StoreLockedError,
)
from storage.lease import LeaseUse
from storage.projectors import project
from storage.recorder import Command, NewEvent, RecordedEvent

__all__ = ["Outcome", "Synchronous", "Writer"]

Synchronous = Literal["FULL", "NORMAL"]

_STORED: Final = "SELECT position, aggregate_id, seq, type, created, data FROM event WHERE id = ?"
_INSERT_EVENT: Final = (
    "INSERT INTO event (position, id, aggregate_id, seq, type, created, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


@attrs.frozen
class Outcome:
    """What became of one command: its records, or the error that refused it."""

    records: list[RecordedEvent] | None = None
    error: BaseException | None = None
    #: False for an idempotent replay: the records were already public.
    publish: bool = True


@attrs.frozen
class Prepared:
    """A command with each event's stored type and encoded data, computed on
    the producer's side so the writer thread spends its time on SQL only."""

    command: Command
    encoded: tuple[tuple[str, str], ...]


Batch = list[Prepared]
Done = Callable[[list[Outcome]], None]


class Writer:
    def __init__(
        self,
        path: str,
        *,
        synchronous: Synchronous,
        loop: asyncio.AbstractEventLoop,
        on_done: Done,
    ) -> None:
        self._path = path
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
        self._position = 0

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
            schema.migrate(conn)
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
        position_before = self._position
        try:
            conn.execute("BEGIN IMMEDIATE")
            outcomes = [self._apply(conn, prepared) for prepared in batch]
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._seqs.clear()
            self._position = position_before
            broken = StorageBrokenError(f"commit failed: {exc}")
            return [Outcome(error=broken) for _ in batch]
        return outcomes

    def _seq(self, conn: sqlite3.Connection, aggregate_id: str) -> int:
        seq = self._seqs.get(aggregate_id)
        if seq is None:
            row = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM event WHERE aggregate_id = ?", (aggregate_id,)
            ).fetchone()
            seq = self._seqs[aggregate_id] = int(row[0])
        return seq

    def _apply(self, conn: sqlite3.Connection, prepared: Prepared) -> Outcome:
        command = prepared.command
        position_before = self._position
        undo: list[tuple[str, int | None]] = []
        conn.execute("SAVEPOINT command")
        try:
            epoch = None if command.lease is None else _use_lease(conn, command.lease)
            replay = self._check_expected(conn, prepared)
            if replay is not None:
                conn.execute("RELEASE command")
                return Outcome(records=replay, publish=False)
            records = self._insert(conn, command.events, prepared.encoded, undo)
            _write_side(conn, command)
            if command.lease is not None and epoch is not None:
                records = _fence_records(conn, command.lease, epoch, records)
            conn.execute("RELEASE command")
            return Outcome(records=records)
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

    def _undo(
        self, conn: sqlite3.Connection, undo: list[tuple[str, int | None]], position: int
    ) -> None:
        conn.execute("ROLLBACK TO command")
        conn.execute("RELEASE command")
        for aggregate_id, seq in reversed(undo):
            if seq is None:
                self._seqs.pop(aggregate_id, None)
            else:
                self._seqs[aggregate_id] = seq
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
        stored = stored_replay(prepared, lambda id_: conn.execute(_STORED, (id_,)).fetchone())
        if stored is not None:
            return stored
        raise refusal(mismatches)

    def _insert(
        self,
        conn: sqlite3.Connection,
        events: Sequence[NewEvent],
        encoded: Sequence[tuple[str, str]],
        undo: list[tuple[str, int | None]],
    ) -> list[RecordedEvent]:
        records = []
        for new, (type_, data) in zip(events, encoded, strict=True):
            agg = new.aggregate_id
            undo.append((agg, self._seqs.get(agg)))
            seq = self._seq(conn, agg) + 1
            self._seqs[agg] = seq
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
            )
            records.append(record)
            conn.execute(
                _INSERT_EVENT, (self._position, new.id, agg, seq, type_, new.created, data)
            )
        for record in records:
            for op in project(record):
                cursor = conn.execute(op.sql, op.params)
                if op.expect is not None and cursor.rowcount != op.expect:
                    raise op.conflict()
        return records


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


_TAKE_LEASE: Final = (
    "INSERT INTO session_lease (session_id, host_id, epoch, expires) VALUES (?, ?, 1, ?)"
    " ON CONFLICT (session_id) DO UPDATE SET host_id = excluded.host_id,"
    " epoch = session_lease.epoch + 1, expires = excluded.expires"
    " WHERE session_lease.expires <= ? OR session_lease.host_id = excluded.host_id"
    " RETURNING epoch"
)
_READ_LEASE: Final = "SELECT host_id, epoch, expires FROM session_lease WHERE session_id = ?"
_INSERT_FENCE: Final = (
    "INSERT INTO event_fence (position, session_id, host_id, epoch) VALUES (?, ?, ?, ?)"
)


def _use_lease(conn: sqlite3.Connection, use: LeaseUse) -> int:
    """Take, check, renew or release ``use``'s lease; the epoch the command holds.

    Raises :class:`LeaseHeldError` (take) or :class:`FencedError` (the others);
    the caller's savepoint rolls the command back either way. The clock is this
    writer's: on SQLite every host is this one process.
    """
    now = time.time_ns() // 1_000_000
    if use.kind == "take":
        row = conn.execute(
            _TAKE_LEASE, (use.session_id, use.host_id, now + use.ttl_ms, now)
        ).fetchone()
        if row is not None:
            return int(row[0])
        held = conn.execute(_READ_LEASE, (use.session_id,)).fetchone()
        raise LeaseHeldError(use.session_id, str(held[0]), int(held[1]))
    held = conn.execute(_READ_LEASE, (use.session_id,)).fetchone()
    if held is None:
        raise FencedError(use.session_id, use.host_id, use.epoch, "no lease was taken")
    if (str(held[0]), int(held[1])) != (use.host_id, use.epoch):
        raise FencedError(
            use.session_id, use.host_id, use.epoch, f"host {held[0]} holds epoch {held[1]}"
        )
    if int(held[2]) <= now:
        raise FencedError(use.session_id, use.host_id, use.epoch, "the lease expired")
    if use.kind == "renew":
        conn.execute(
            "UPDATE session_lease SET expires = ? WHERE session_id = ?",
            (now + use.ttl_ms, use.session_id),
        )
    elif use.kind == "release":
        conn.execute("UPDATE session_lease SET expires = 0 WHERE session_id = ?", (use.session_id,))
    return use.epoch


def _fence_records(
    conn: sqlite3.Connection, use: LeaseUse, epoch: int, records: list[RecordedEvent]
) -> list[RecordedEvent]:
    """Record who wrote the lease's session's events; the appender's copies carry the epoch."""
    mine = [r for r in records if r.aggregate_id == use.session_id]
    conn.executemany(
        _INSERT_FENCE, [(r.position, use.session_id, use.host_id, epoch) for r in mine]
    )
    return [
        attrs.evolve(r, epoch=epoch) if r.aggregate_id == use.session_id else r for r in records
    ]


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
