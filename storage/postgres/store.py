"""The PostgreSQL store: the event log, its projections and their readers, shared by hosts.

    async with PostgresStore("postgresql://user@db/sessionrt") as store:
        records = await store.append(Command.of(event))
        session = await store.queries.session(session_id)

The same surface and semantics as :class:`~storage.sqlite.SQLiteStore`
(group commit, one transaction per batch, one command's failure failing it
alone, seq from 1 without gaps, idempotent exact replay, projections in the
same transaction, commands committed in submission order, subscribers told
only after COMMIT), except that any number of processes on any number of
hosts may write one database: see :mod:`.writer` for how seq and position
stay safe, and the ordering ``read_all`` guarantees. ``batch_paths`` counts
the batches committed whole and those redone a command at a time.

Connections: one writer (a task committing one batch at a time,
reconnecting after losing it), a pool of ``readers``, and one that LISTENs
(:mod:`.listen`), listed while it does so that other origins' batches
notify it (:mod:`.listeners`). Subscribers hear this store's own commits
right after COMMIT, and other processes' commits once the notice arrives:
the listener reads those rows back from the table, in commit order. So each
origin's batches reach a subscriber in position order, but a local batch
may be heard before an earlier remote one is read back; a reader that needs
one total order reads it from the log (``read_all``), as
:mod:`storage.follow` does.

``read_only=True`` opens no writer and runs no migration (an older schema
is refused), and its readers' sessions are read-only; it still listens.

Life cycle: unopened -> open -> closed, as for SQLite. The URL's password
never appears in a log line or an error: :func:`storage._url.redact`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Final, Self

import asyncpg

from protocol import ids
from protocol.lifecycle import Lifecycle
from storage._subscribers import Subscribers
from storage._url import redact
from storage.batch import Outcome, Prepared, prepare
from storage.errors import StorageBrokenError, StoreClosedError
from storage.lease import apply_fence
from storage.postgres import schema
from storage.postgres._errors import UNAVAILABLE
from storage.postgres._errors import reason as _reason
from storage.postgres.listen import Listener, notices
from storage.postgres.listeners import UNLIST, Origins, register
from storage.postgres.notify import Notice
from storage.postgres.readers import Readers
from storage.postgres.remote import RemoteCommits
from storage.postgres.writer import LOG_LOCK, commit_batch
from storage.queries import DECODE_CACHE_BYTES, Queries, Row
from storage.reads import LogReads
from storage.recorder import Command, RecordedEvent, Subscriber
from storage.schema import SCHEMA_VERSION

__all__ = ["CHANNEL", "PostgresStore"]

log = logging.getLogger(__name__)

#: A batch never holds more commands than this (as for SQLite).
MAX_BATCH: Final = 1024
#: A batch of at least this many commands ends with the next one's BEGIN and
#: lock (:func:`.writer.commit_batch`'s ``chain``): that many appenders, each
#: awaiting its append, are likely to append again at once (measured in
#: ``scripts/bench_postgres.py``: one round trip fewer per batch).
CHAIN_MIN: Final = 8
#: The NOTIFY channel every store of one database shares.
CHANNEL: Final = "sessionrt_log"


class PostgresStore(LogReads):
    def __init__(
        self,
        url: str,
        *,
        readers: int = 4,
        read_only: bool = False,
        decode_cache_bytes: int = DECODE_CACHE_BYTES,
        channel: str = CHANNEL,
    ) -> None:
        self._url = url
        #: The URL without its password: what logs and errors may show.
        self.where = redact(url)
        self.read_only = read_only
        self.channel = channel
        #: Tells this store's NOTIFYs from other processes'.
        self.origin = ids.event_id().removeprefix("evt_")
        self._lifecycle = Lifecycle("store", StoreClosedError)
        #: Opened at open (the migration runs on it); replaced when lost.
        self._writer: asyncpg.Connection | None = None
        self._readers = Readers(url, self.where, size=readers, read_only=read_only)
        self._listener: Listener | None = None
        self._pending: list[tuple[Prepared, asyncio.Future[list[RecordedEvent]]]] = []
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._write_task: asyncio.Task[None] | None = None
        self._deliver_task: asyncio.Task[None] | None = None
        #: The origins of the notices heard (hosts of an earlier build get rows).
        self._origins = Origins(self._listener_fetchval)
        self._origins_task: asyncio.Task[None] | None = None
        #: Everything up to here (other origins') has been handed to subscribers.
        self._remote = RemoteCommits(self.fetch, self._publish)
        self._subscribers = Subscribers()
        #: Called after each batch with (commands, seconds from hand-off to outcome).
        self.batch_observers: list[Callable[[int, float], None]] = []
        self.queries = Queries(
            self.fetch, cache_bytes=decode_cache_bytes, fetch_many=self.fetch_many
        )
        #: Batches committed whole, and redone with a SAVEPOINT per command;
        #: batches begun by the one before (chained), and chains given back unused.
        self.batch_paths = {"plain": 0, "isolated": 0}
        self.chains = {"taken": 0, "released": 0}
        #: The writer is in a transaction holding the lock, begun by the last
        #: batch's COMMIT for the next one (given back if none comes at once).
        self._held = False

    @property
    def path(self) -> str | None:
        """No local file: a server holds the database (see :class:`storage.Store`)."""
        return None

    @property
    def exclusive(self) -> bool:
        """Other hosts write the same database."""
        return False

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r}, {self._lifecycle.state.value})"

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

    async def _connect(self) -> asyncpg.Connection:
        try:
            # The writer's and the listener's statements are few and run for
            # the store's life: kept prepared (asyncpg's cache of 100, least
            # recently used closed first), not prepared again every 300 s.
            return await asyncpg.connect(self._url, max_cached_statement_lifetime=0)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StorageBrokenError(f"cannot connect to {self.where}: {_reason(exc)}") from None

    async def open(self) -> None:
        self._lifecycle.open()
        try:
            if self.read_only:
                conn = await self._connect()
                try:
                    found = await schema.version(conn)
                finally:
                    await conn.close()
                if found != SCHEMA_VERSION:
                    raise StorageBrokenError(
                        f"{self.where} is at schema version {found}, this build reads"
                        f" {SCHEMA_VERSION}; open it for writing once to migrate"
                    )
            else:
                self._writer = await self._connect()
                await schema.migrate(self._writer)
            await self._readers.open()
            self._listener = Listener(
                self._connect,
                self.channel,
                on_payload=notices(self.origin, self._noticed),
                on_reconnect=self._remote.lost_notices,
                on_listening=self._list_listener,
            )
            await self._listener.start()
            # Listening first, then the cursor: a commit in between is both
            # past the cursor and announced, and the cursor trims the overlap.
            await self._remote.start_after(
                int(await self._fetchval("SELECT coalesce(max(position), 0) FROM event"))
            )
            self._deliver_task = asyncio.create_task(
                self._remote.deliver(), name="sessionrt-deliver"
            )
            self._origins_task = asyncio.create_task(
                self._origins.look_up(), name="sessionrt-origins"
            )
            if not self.read_only:
                self._write_task = asyncio.create_task(self._write_loop(), name="sessionrt-write")
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if not self._lifecycle.begin_close():
            return
        try:
            await self._drained.wait()
        finally:
            for task in (self._write_task, self._deliver_task, self._origins_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self._listener is not None:
                await self._unlist()
                await self._listener.stop()
            writer, self._writer = self._writer, None
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer.close()
            await self._readers.close()
            self._lifecycle.closed()

    @property
    def is_open(self) -> bool:
        return self._lifecycle.is_open

    @property
    def listener(self) -> Listener:
        """The LISTEN side (tests drop its connection through it)."""
        assert self._listener is not None
        return self._listener

    def _check_open(self) -> None:
        self._lifecycle.check_open()

    async def _list_listener(self, conn: asyncpg.Connection) -> None:
        """The listen connection is (again) in place: list it, so batches notify it."""
        await register(conn, self.origin, lock=LOG_LOCK)

    async def _listener_fetchval(self, sql: str, *args: object) -> Any:
        assert self._listener is not None
        return await self._listener.fetchval(sql, *args)

    async def _unlist(self) -> None:
        """Stop other origins' batches notifying this store (best effort: a row
        left behind is deleted by the next store to list itself)."""
        assert self._listener is not None
        if not self._listener.ready.is_set():
            return  # never listed, or reconnecting: nothing to wait for
        with contextlib.suppress(Exception):  # TimeoutError too: the connection may be lost
            async with asyncio.timeout(1.0):
                await self._listener.execute(UNLIST, self.origin)

    def _noticed(self, notice: Notice) -> None:
        """Another host's commit: for the followers, and its origin looked up."""
        self._remote.noticed(notice)
        self._origins.heard(notice.origin)

    # -- appends --------------------------------------------------------------------------------

    async def append(self, command: Command) -> list[RecordedEvent]:
        """Commit ``command``; returns its records once they are durable.

        Cancelling the caller does not withdraw a submitted command; a failure
        nobody awaits any more (a fenced append of an execution cancelled for
        losing its lease) lands on a cancelled future, never reported to the loop.
        """
        # Awaited directly, not through asyncio.shield (one fewer callback
        # and task hop per append): cancelling the caller cancels only this
        # future, which nobody else holds; the command stays queued or in
        # flight, and the batch's outcome skips a future that is done.
        return await self.submit(command)

    def submit(self, command: Command) -> asyncio.Future[list[RecordedEvent]]:
        """Queue ``command``; a future of its records. Commands commit in
        submission order, so a caller may submit several and await the last."""
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.where} is open read-only")
        future: asyncio.Future[list[RecordedEvent]] = asyncio.get_running_loop().create_future()
        command = apply_fence(command)
        if command.empty:
            future.set_result([])
            return future
        self._pending.append((prepare(command), future))
        self._drained.clear()
        self._wake.set()
        return future

    async def _write_loop(self) -> None:
        """Take what is pending (at most :data:`MAX_BATCH`), commit it, repeat."""
        while True:
            if not self._pending and self._held:
                # The last batch began the next one under the lock: its
                # appenders, woken by their outcomes, have one tick to append
                # again; other hosts wait for the lock meanwhile, so no longer.
                await asyncio.sleep(0)
                if not self._pending:
                    await self._release()
                continue
            if not self._pending:
                self._drained.set()
                await self._wake.wait()
                self._wake.clear()
                # One tick for producers that are already runnable to join the batch.
                await asyncio.sleep(0)
                continue
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            started = time.perf_counter()
            try:
                outcomes, published = await self._commit([p for p, _ in batch])
            except Exception as exc:
                # Nothing named it (a bug, or the driver failing in a way not
                # foreseen): the batch fails, its appenders hear so, and the
                # writer goes on, on a new connection. A dead writer would
                # leave its appenders waiting for ever.
                log.exception("the writer failed")
                self._drop_writer()
                broken = StorageBrokenError(f"commit failed: {type(exc).__name__}")
                outcomes, published = [Outcome(error=broken) for _ in batch], []
            self._batch_done(batch, outcomes, published, time.perf_counter() - started)

    async def _release(self) -> None:
        """Give back the lock the last batch took for a next one that did not come."""
        self._held = False
        self.chains["released"] += 1
        assert self._writer is not None
        try:
            await self._writer.execute("ROLLBACK")
        except (*UNAVAILABLE, asyncpg.PostgresError):
            self._drop_writer()  # the next batch makes a new one

    def _drop_writer(self) -> None:
        """Forget the writer connection (closing it at once); the next batch makes one."""
        self._held = False
        writer, self._writer = self._writer, None
        if writer is not None and not writer.is_closed():
            writer.terminate()

    async def _commit(self, batch: list[Prepared]) -> tuple[list[Outcome], list[RecordedEvent]]:
        writer = self._writer
        begun, self._held = self._held, False
        try:
            if writer is None or writer.is_closed():
                begun = False
                writer = self._writer = await self._connect()
            result = await commit_batch(
                writer,
                batch,
                channel=self.channel,
                origin=self.origin,
                own=self._remote.own,
                begun=begun,
                chain=len(batch) >= CHAIN_MIN and self._lifecycle.is_open,
            )
        except (*UNAVAILABLE, asyncpg.PostgresError, StorageBrokenError) as exc:
            # The outcome of a COMMIT cut off by a lost connection is unknown;
            # an exact replay of the command is idempotent, so retrying is safe.
            if writer is not None and (
                writer.is_closed()
                or writer.is_in_transaction()
                or isinstance(exc, asyncpg.InternalClientError)
            ):
                self._drop_writer()  # the driver's own state is in doubt: a new one
            broken = StorageBrokenError(f"commit failed: {_reason(exc)}")
            return [Outcome(error=broken) for _ in batch], []
        self.batch_paths["isolated" if result.isolated else "plain"] += 1
        self.chains["taken"] += begun
        self._held = result.chained
        return result.outcomes, result.published

    def _batch_done(
        self,
        batch: list[tuple[Prepared, asyncio.Future[list[RecordedEvent]]]],
        outcomes: list[Outcome],
        published: list[RecordedEvent],
        elapsed: float,
    ) -> None:
        for observe in self.batch_observers:
            try:
                observe(len(batch), elapsed)
            except Exception:
                log.exception("batch observer failed")
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if outcome.records is not None:
                future.set_result(outcome.records)
            else:
                future.set_exception(outcome.error or StorageBrokenError("no outcome"))
        if published:
            self._publish(published)

    # -- live subscribers -----------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        return self._subscribers.subscribe(subscriber)

    def _publish(self, records: Sequence[RecordedEvent]) -> None:
        self._subscribers.publish(records)

    # -- reads ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[asyncpg.Connection]:
        """Borrow a connection in a read-only snapshot (several statements, one view)."""
        self._check_open()
        async with self._readers.snapshot() as conn:
            yield conn

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self._check_open()
        return await self._readers.fetch(sql, params)

    async def fetch_many(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        """Several statements in one read-only snapshot (:meth:`reader`)."""
        self._check_open()
        return await self._readers.fetch_many(statements)

    async def check_writable(
        self, timeout_s: float, blocking: Callable[..., Awaitable[None]]
    ) -> None:
        """Raise :class:`StorageBrokenError` unless the server answers and takes writes.

        Writes nothing; nothing blocks, so ``blocking`` is not needed.
        """
        try:
            async with asyncio.timeout(timeout_s):
                [[recovering]] = await self.fetch("SELECT pg_is_in_recovery()")
        except TimeoutError:
            raise StorageBrokenError(f"{self.where} did not answer in {timeout_s} s") from None
        except asyncpg.PostgresError as exc:
            raise StorageBrokenError(f"{self.where}: {_reason(exc)}") from None
        if recovering or self.read_only:
            raise StorageBrokenError(f"{self.where} does not take writes")

    async def _fetchval(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = await self.fetch(sql, params)
        return rows[0][0]
