"""The SQLite store: the event log, its projections and their readers.

    async with SQLiteStore(path) as store:
        records = await store.append(Command.of(event))
        session = await store.queries.session(session_id)

Appends go to the single :class:`~storage._writer.Writer` (group commit);
reads go to a small pool of read-only aiosqlite connections, so a long read
never holds up a commit and vice versa (WAL). A read that is short runs on
the loop's own thread instead, within a time budget past which it moves to
the pool (:mod:`storage._inline_reads`: that saves a GIL hand-off per row).

``SQLiteStore(path, read_only=True)`` is for commands that only read: no
writer, no migration, no lock taken for writing (a shared one instead, so no
writer starts under it, and it refuses to open while one runs); every
connection is opened ``mode=ro``, and appends raise :class:`StoreClosedError`.

Life cycle: unopened -> open -> closed. Entering twice, or using the store
before opening or after closing, raises :class:`StoreClosedError`. Closing
waits for every submitted command to commit (or fail) first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from threading import Thread
from types import TracebackType
from typing import Any, Final, Self

import aiosqlite

from protocol.lifecycle import Lifecycle
from storage._inline_reads import InlineReader
from storage._subscribers import Subscribers
from storage._writer import Synchronous, Writer, shared_lock
from storage.batch import Outcome, Prepared, prepare
from storage.clock import SYSTEM, Clock
from storage.errors import StorageBrokenError, StoreClosedError
from storage.lease import apply_fence
from storage.queries import DECODE_CACHE_BYTES, Queries, Row
from storage.reads import LogReads
from storage.recorder import Command, RecordedEvent, Subscriber

__all__ = ["SQLiteStore"]


def _fetch_many_boxed(
    conn: aiosqlite.Connection, statements: Sequence[tuple[str, Sequence[Any]]]
) -> list[list[list[Row]]]:
    """On the reader's thread: each statement's rows, all from one read snapshot,
    in a list the caller empties."""
    raw = conn._conn
    raw.execute("BEGIN")
    try:
        out = [raw.execute(sql, params).fetchall() for sql, params in statements]
    finally:
        raw.execute("COMMIT")
    return [out]


log = logging.getLogger(__name__)

#: A batch handed to the writer never holds more commands than this, so one
#: huge burst cannot make the first caller wait for all the others.
MAX_BATCH: Final = 1024


class SQLiteStore(LogReads):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        readers: int = 4,
        read_only: bool = False,
        decode_cache_bytes: int = DECODE_CACHE_BYTES,
        clock: Clock = SYSTEM,
    ) -> None:
        self.path = os.fspath(path)
        #: What lease expiry is measured on (the writer's clock; tests advance their own).
        self.clock = clock
        self.synchronous: Synchronous = synchronous
        self.read_only = read_only
        self._shared_lock: int | None = None
        self._reader_count = readers
        self._lifecycle = Lifecycle("store", StoreClosedError)
        self._writer: Writer | None = None
        self._pending: list[tuple[Prepared, asyncio.Future[list[RecordedEvent]]]] = []
        self._inflight = False
        self._flush_scheduled = False
        self._batch: list[tuple[Prepared, asyncio.Future[list[RecordedEvent]]]] = []
        self._drained = asyncio.Event()
        self._drained.set()
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all_readers: list[aiosqlite.Connection] = []
        self.inline = InlineReader(self.path, read_only=read_only)
        #: One writer process per file (its lock): every change to the log is this process's.
        self.exclusive = True
        self._subscribers = Subscribers()
        #: Called after each batch with (commands, seconds from hand-off to outcome).
        self.batch_observers: list[Callable[[int, float], None]] = []
        self._batch_started = 0.0
        self.queries = Queries(
            self.fetch, cache_bytes=decode_cache_bytes, fetch_many=self.fetch_many
        )

    # -- life cycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        self._lifecycle.open()
        try:
            if self.read_only:
                self._shared_lock = await asyncio.to_thread(shared_lock, self.path)
            else:
                self._writer = Writer(
                    self.path,
                    synchronous=self.synchronous,
                    loop=asyncio.get_running_loop(),
                    on_done=self._batch_done,
                    clock=self.clock,
                )
                await self._writer.start()
            target = f"file:{self.path}?mode=ro" if self.read_only else self.path
            for _ in range(self._reader_count):
                connecting = aiosqlite.connect(target, isolation_level=None, uri=self.read_only)
                try:
                    conn = await connecting
                except BaseException as exc:
                    # aiosqlite queues its thread's stop without awaiting it; the
                    # thread then answers the stop on this loop. Wait for it to
                    # end, or it may answer a loop that has closed meanwhile.
                    await _threads_gone([connecting])
                    if isinstance(exc, sqlite3.Error):
                        raise StorageBrokenError(f"cannot open {self.path}: {exc}") from exc
                    raise
                self._all_readers.append(conn)
                await conn.execute("PRAGMA query_only = ON")
                self._readers.put_nowait(conn)
            try:
                # Opened on a reader's thread (opening a file may block), then
                # used on the loop's.
                if self._all_readers:
                    self.inline.adopt(
                        await self._all_readers[0]._execute(  # type: ignore[no-untyped-call]
                            self.inline.connect
                        )
                    )
            except sqlite3.Error as exc:
                raise StorageBrokenError(f"cannot open {self.path}: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if not self._lifecycle.begin_close():
            return
        try:
            await self._drained.wait()
            if self._writer is not None:
                await self._writer.stop()
        finally:
            self.inline.close()
            for conn in self._all_readers:
                with contextlib.suppress(Exception):
                    await conn.close()
            await _threads_gone(self._all_readers)
            self._all_readers.clear()
            if self._shared_lock is not None:
                os.close(self._shared_lock)
                self._shared_lock = None
            self._lifecycle.closed()

    @property
    def is_open(self) -> bool:
        return self._lifecycle.is_open

    def _check_open(self) -> None:
        self._lifecycle.check_open()

    # -- appends --------------------------------------------------------------------------------

    async def append(self, command: Command) -> list[RecordedEvent]:
        """Commit ``command``; returns its records once they are durable.

        Cancelling the caller does not withdraw a submitted command: it commits
        (or fails) with its batch either way; a failure nobody awaits any more
        (typically a fenced append of an execution cancelled for losing its
        lease) lands on a cancelled future, so the loop never reports it.
        """
        # Awaited directly, not through asyncio.shield (one fewer callback
        # and task hop per append): cancelling the caller cancels only this
        # future, which nobody else holds; the command stays queued or in
        # flight, and the batch's outcome skips a future that is done.
        return await self.submit(command)

    def submit(self, command: Command) -> asyncio.Future[list[RecordedEvent]]:
        """Queue ``command`` and return a future of its records, without waiting.

        Commands commit in submission order, so a caller may submit several
        and await only the last one it needs to be durable.
        """
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.path} is open read-only")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[RecordedEvent]] = loop.create_future()
        command = apply_fence(command)
        if command.empty:
            future.set_result([])
            return future
        # Encoding here, on the loop, overlaps with the writer's fsync (a large
        # command is encoded by the writer instead: see prepare()).
        self._pending.append((prepare(command), future))
        self._drained.clear()
        if not self._inflight and not self._flush_scheduled:
            # Flush on the next tick, not now: producers that are already
            # runnable (typically everyone the last COMMIT just woke) get to
            # join this batch instead of queueing behind a batch of one.
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        assert self._writer is not None
        self._flush_scheduled = False
        if self._inflight or not self._pending:
            return
        batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        self._inflight = True
        self._batch = batch
        self._batch_started = time.perf_counter()
        self._writer.submit([prepared for prepared, _ in batch])

    def _batch_done(self, outcomes: list[Outcome]) -> None:
        batch, self._batch = self._batch, []
        self._inflight = False
        if self.batch_observers:
            elapsed = time.perf_counter() - self._batch_started
            for observe in self.batch_observers:
                try:
                    observe(len(batch), elapsed)
                except Exception:
                    log.exception("batch observer failed")
        published: list[RecordedEvent] = []
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if outcome.records is not None:
                if outcome.publish:
                    published.extend(outcome.records)
                if not future.done():
                    future.set_result(outcome.records)
            elif not future.done():
                future.set_exception(outcome.error or StorageBrokenError("no outcome"))
        if self._pending:
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._drained.set()
        if published:
            self._publish(published)

    # -- live subscribers -----------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        return self._subscribers.subscribe(subscriber)

    def _publish(self, records: Sequence[RecordedEvent]) -> None:
        self._subscribers.publish(records)

    # -- reads ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[aiosqlite.Connection]:
        """Borrow a read-only connection (for several statements in one snapshot)."""
        self._check_open()
        conn = await self._readers.get()
        try:
            yield conn
        finally:
            self._readers.put_nowait(conn)

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        [rows] = await self.fetch_many(((sql, params),))
        return rows

    async def fetch_many(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        """Several statements in one read snapshot: on the loop when short, else in
        one hop to a reader thread.

        Each hop costs the loop a thread hand-off and a wake-up, which under
        load (100 sessions stepping) weighed more than the statements: the
        reads a drain makes together go together.
        """
        self._check_open()
        inline = self.inline.fetch_many(statements)
        if inline is not None:
            await asyncio.sleep(0)  # a turn for the rest of the loop, as a thread hop gave
            return inline
        async with self.reader() as conn:
            # aiosqlite's worker thread keeps its last result bound until its
            # next job: with the rows returned directly, each idle reader held
            # the whole of its last read (a long transcript: hundreds of MB per
            # reader). The rows travel in a box emptied here, so the thread
            # keeps only the empty box.
            box: list[list[list[Row]]] = await conn._execute(  # type: ignore[no-untyped-call]
                _fetch_many_boxed, conn, statements
            )
            return box.pop()

    async def check_writable(
        self, timeout_s: float, blocking: Callable[..., Awaitable[None]]
    ) -> None:
        """Take the database's write lock and let it go, writing nothing.

        Raises :class:`StorageBrokenError` when the file cannot take a write
        now (read-only file system, permissions, a lock held past
        ``timeout_s``). ``blocking`` runs the probe off the loop (the caller
        owns its threads).
        """
        self._check_open()
        try:
            await blocking(_probe_writable, self.path, timeout_s)
        except (sqlite3.Error, OSError) as exc:
            raise StorageBrokenError(str(exc)) from None


def _probe_writable(path: str, timeout_s: float) -> None:
    """``BEGIN IMMEDIATE`` then ``ROLLBACK`` on a connection of its own (blocking)."""
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()


async def _threads_gone(readers: Sequence[aiosqlite.Connection]) -> None:
    """Wait (briefly, without blocking the loop) for the readers' threads to exit.

    aiosqlite resolves ``close()`` from inside its worker thread just before the
    thread ends; a closed store must not leave a thread behind, even briefly.
    """
    threads = [t for c in readers if isinstance(t := getattr(c, "_thread", None), Thread)]
    for _ in range(1000):
        if not any(t.is_alive() for t in threads):
            return
        await asyncio.sleep(0.001)
