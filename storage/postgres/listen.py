"""The LISTEN side: one dedicated connection per channel, kept, and the catch-up after losing it.

:class:`Listener` LISTENs on a channel and hands each payload to its handler,
in commit order (PostgreSQL delivers notifications of different transactions
in commit order); :func:`notices` turns a store's handler into one that skips
the store's own commits and parses the rest. A dropped connection is noticed
by asyncpg's termination callback, or by a ping every :data:`PING_S` seconds
(a silent network loss), and reconnected with a capped backoff, through any
failure to connect (a server restarting refuses connections for a while);
once listening again, the owner is told to catch up (``on_reconnect``):
whatever committed while nobody listened is read from the table. Payloads
the new connection hears before that (while its owner lists it) are held
and handed over right after, so an owner that reads "everything after my
cursor" on that call never meets a notice from past the gap first. The same
connection runs the owner's short statements (:meth:`Listener.execute`, one
at a time with the pings), so a host's notices need no second connection.
Connection errors never carry the URL (it may hold a password).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import asyncpg

from storage.errors import StorageBrokenError, StorageError
from storage.postgres._errors import UNAVAILABLE
from storage.postgres.notify import Notice, own_prefix, parse

__all__ = ["PING_S", "Listener", "notices"]

log = logging.getLogger(__name__)

#: Seconds between pings of an idle listen connection.
PING_S: Final = 5.0
_BACKOFF_MAX_S: Final = 2.0
#: Payloads held while a new connection's owner is not told yet; past this,
#: the rest are dropped (the owner's catch-up reads what they announced).
MAX_HELD: Final = 1024
#: What a failed connection attempt or statement raises: the connection not
#: there for now (UNAVAILABLE, the driver's InternalClientError included), any
#: other server error, and a connect function's own (a store's raises
#: StorageBrokenError).
_LOST: Final = (*UNAVAILABLE, asyncpg.PostgresError, StorageError)


def notices(origin: str, on_notice: Callable[[Notice], None]) -> Callable[[str], None]:
    """A payload handler for a store of ``origin``: its own commits skipped (it
    already told its subscribers), the others' parsed and passed on."""
    own_header = own_prefix(origin)

    def on_payload(payload: str) -> None:
        # Every listener hears every NOTIFY: skip this store's own by the
        # header's origin before parsing the lines.
        if payload.startswith(own_header):
            return
        notice = parse(payload)
        if notice is None:
            log.warning("unreadable commit notice")
        elif notice.origin != origin:
            on_notice(notice)

    return on_payload


class Listener:
    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        *,
        on_payload: Callable[[str], None],
        on_reconnect: Callable[[], None],
        on_listening: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._on_payload = on_payload
        self._on_reconnect = on_reconnect
        #: Run on each new connection once it LISTENs, before the listener is
        #: ready or ``on_reconnect`` is told (a store lists itself there:
        #: :mod:`.listeners`); what it raises fails the attempt.
        self._on_listening = on_listening
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        #: One statement at a time on the connection: the pings and the owner's.
        self._busy = asyncio.Lock()
        self.ready = asyncio.Event()
        #: Times the connection was (re)established; tests and metrics read it.
        self.connects = 0
        #: Payloads of a new connection heard before ``on_reconnect`` was called.
        self._held: list[str] | None = None

    async def start(self) -> None:
        """Listen; returns once the first LISTEN is in place."""
        conn = await self._connect()
        await self._listen(conn)
        self._task = asyncio.create_task(self._run(conn), name=f"sessionrt-listen:{self._channel}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._drop()

    async def execute(self, sql: str, *args: object) -> None:
        """Run a short statement on the listen connection, waiting for it to be
        back if it is reconnecting (callers bound the wait); raises
        StorageBrokenError when the statement fails for want of a connection."""
        await self.fetchval(sql, *args)

    async def fetchval(self, sql: str, *args: object) -> Any:
        """:meth:`execute`, returning the first column of the first row (None for none)."""
        while True:
            await self.ready.wait()
            conn = self._conn
            if conn is None or conn.is_closed():
                # Lost, and the run loop has not noticed yet: it will.
                await asyncio.sleep(0.01)
                continue
            async with self._busy:
                try:
                    return await conn.fetchval(sql, *args)
                except _LOST as exc:
                    if conn.is_closed():
                        continue  # lost meanwhile: once more on the next connection
                    raise StorageBrokenError(f"statement failed: {type(exc).__name__}") from None

    @property
    def server_pid(self) -> int | None:
        """The server process of the connection in use (None while there is none)."""
        conn = self._conn
        return None if conn is None or conn.is_closed() else conn.get_server_pid()

    def kill_connection(self) -> None:
        """Drop the connection as a network failure would (for tests)."""
        if self._conn is not None:
            self._conn.terminate()

    async def _listen(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        await conn.add_listener(self._channel, self._notified)
        if self._on_listening is not None:
            await self._on_listening(conn)
        self.connects += 1
        self.ready.set()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.ready.clear()
        if conn is not None and not conn.is_closed():
            # asyncio.timeout, not wait_for, which on 3.11 can swallow a
            # cancellation that lands as the close completes.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await conn.close()
            if not conn.is_closed():
                conn.terminate()

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if self._held is not None:
            if len(self._held) < MAX_HELD:
                self._held.append(payload)
            return
        self._deliver(payload)

    def _deliver(self, payload: str) -> None:
        try:
            self._on_payload(payload)
        except Exception:
            log.exception("a notice handler on %s failed", self._channel)

    async def _run(self, conn: asyncpg.Connection) -> None:
        while True:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PING_S):
                        await lost.wait()
                if lost.is_set() or conn.is_closed():
                    break
                try:
                    async with asyncio.timeout(PING_S), self._busy:
                        await conn.execute("SELECT 1")
                except (TimeoutError, *_LOST):
                    break
            log.warning("lost the listen connection on %s; reconnecting", self._channel)
            self._held = []
            await self._drop()
            conn = await self._reconnect()
            # As loud as the loss: an operator reading warnings sees both ends.
            log.warning("listening on %s again", self._channel)
            held, self._held = self._held, None
            self._on_reconnect()
            for payload in held or ():
                self._deliver(payload)

    async def _reconnect(self) -> asyncpg.Connection:
        backoff = 0.05
        while True:
            try:
                conn = await self._connect()
                await self._listen(conn)
                return conn
            except _LOST as exc:
                log.warning("cannot listen on %s yet: %s", self._channel, type(exc).__name__)
                await self._drop()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
