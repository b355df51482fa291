"""The LISTEN side: one dedicated connection per store, and the catch-up after losing it.

:class:`Listener` LISTENs on the store's channel and hands each other
origin's notice to the store, in commit order (PostgreSQL delivers
notifications of different transactions in commit order). A dropped
connection is noticed by asyncpg's termination callback, or by a ping every
:data:`PING_S` seconds (a silent network loss), and reconnected with a
capped backoff; once listening again, the store is told to catch up
(``on_reconnect``): whatever committed while nobody listened is read from the
table. Connection errors never carry the URL (it may hold a password).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import asyncpg

from storage.postgres.notify import Notice, own_prefix, parse

__all__ = ["PING_S", "Listener"]

log = logging.getLogger(__name__)

#: Seconds between pings of an idle listen connection.
PING_S: Final = 5.0
_BACKOFF_MAX_S: Final = 2.0


class Listener:
    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        origin: str,
        *,
        on_notice: Callable[[Notice], None],
        on_reconnect: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._origin = origin
        #: How this store's own payloads begin (see :mod:`.notify`).
        self._own_header = own_prefix(origin)
        self._on_notice = on_notice
        self._on_reconnect = on_reconnect
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        #: Times the connection was (re)established; tests and metrics read it.
        self.connects = 0

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

    def kill_connection(self) -> None:
        """Drop the connection as a network failure would (for tests)."""
        if self._conn is not None:
            self._conn.terminate()

    async def _listen(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        await conn.add_listener(self._channel, self._notified)
        self.connects += 1
        self.ready.set()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.ready.clear()
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 1.0)
            if not conn.is_closed():
                conn.terminate()

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        # This store's own commits come back too (every listener hears every
        # NOTIFY): skip them by the header's origin before parsing the lines.
        if payload.startswith(self._own_header):
            return
        notice = parse(payload)
        if notice is None:
            log.warning("unreadable commit notice on %s", channel)
        elif notice.origin != self._origin:
            self._on_notice(notice)

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
                    async with asyncio.timeout(PING_S):
                        await conn.execute("SELECT 1")
                except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    break
            log.warning("lost the listen connection on %s; reconnecting", self._channel)
            await self._drop()
            conn = await self._reconnect()
            self._on_reconnect()

    async def _reconnect(self) -> asyncpg.Connection:
        backoff = 0.05
        while True:
            try:
                conn = await self._connect()
                await self._listen(conn)
                return conn
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("cannot listen on %s yet: %s", self._channel, type(exc).__name__)
                await self._drop()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
