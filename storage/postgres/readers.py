"""A store's readers: a pool of connections, each statement in the shared SQL dialect.

``fetch`` runs one statement; ``fetch_many`` several in one read-only
snapshot (one round trip per statement, between its BEGIN and COMMIT). A
read the server or the network cuts off is a
:class:`~storage.errors.StorageBrokenError` (a 503 at the front door, not a
500). A store opened ``read_only`` gets read-only sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from storage.errors import StorageBrokenError
from storage.postgres._errors import UNAVAILABLE, reason
from storage.postgres.dialect import translate
from storage.queries import Row

__all__ = ["Readers"]


class Readers:
    def __init__(self, url: str, where: str, *, size: int, read_only: bool) -> None:
        self._url = url
        #: The URL without its password, for errors.
        self._where = where
        self._size = size
        self._read_only = read_only
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        settings = {"default_transaction_read_only": "on"} if self._read_only else {}
        try:
            self._pool = await asyncpg.create_pool(
                self._url,
                min_size=1,
                max_size=self._size,
                server_settings=settings,
                reset=_keep_session,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StorageBrokenError(f"cannot connect to {self._where}: {reason(exc)}") from None

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):  # TimeoutError too: terminated below
                async with asyncio.timeout(5.0):  # not wait_for (3.11 can swallow a cancel)
                    await pool.close()
            pool.terminate()

    @contextlib.asynccontextmanager
    async def snapshot(self) -> AsyncIterator[asyncpg.Connection]:
        """Borrow a connection in a read-only snapshot (several statements, one view)."""
        assert self._pool is not None
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            yield conn

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        assert self._pool is not None
        try:
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(translate(sql), *params)
        except UNAVAILABLE as exc:
            raise StorageBrokenError(f"read failed: {reason(exc)}") from None
        return [tuple(r) for r in rows]

    async def fetch_many(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        try:
            async with self.snapshot() as conn:
                out: list[list[Row]] = []
                for sql, params in statements:
                    rows = await conn.fetch(translate(sql), *params)
                    out.append([tuple(r) for r in rows])
        except UNAVAILABLE as exc:
            raise StorageBrokenError(f"read failed: {reason(exc)}") from None
        return out


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A reader's reset on release: nothing beyond asyncpg's own rollback.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` before the connection goes back, and the caller
    of :meth:`Readers.fetch` waits for it: a second round trip on every read
    (twice the latency of a point read under load). A reader connection
    never gets that state: it only runs :meth:`~Readers.fetch`'s single
    statements and :meth:`~Readers.snapshot`'s read-only transactions, an
    open transaction is still rolled back (asyncpg does that before calling
    this), and the pool's ``server_settings`` are startup parameters, which
    RESET ALL would keep anyway.
    """
