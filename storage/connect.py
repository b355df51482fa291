"""The one place a store (or a host channel) is constructed: the backend follows ``database``.

    store = connect(config.database_target, read_only=False)
    async with store: ...

A ``postgresql://`` (or ``postgres://``) URL selects
:class:`storage.postgres.PostgresStore`, imported only then (its driver is
not needed for SQLite); anything else is the path of a SQLite file. Hosts
sharing a database server reach each other through :func:`host_channel`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Final

from storage._url import redact
from storage._writer import Synchronous
from storage.clock import SYSTEM, Clock
from storage.errors import StorageError
from storage.interfaces import HostChannel, Store
from storage.queries import DECODE_CACHE_BYTES
from storage.sqlite import SQLiteStore

__all__ = ["POSTGRES_SCHEMES", "connect", "host_channel", "is_server_url"]

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")


#: Reader threads of a connected SQLite store. Every sqlite3 statement hands the
#: GIL off and back, so each reader thread is one more contender for it with the
#: loop and the writer: with 100 sessions stepping at once (scripts/bench_runtime.py
#: phase 2) two readers made ~12% more steps/s than four (one: no better than two).
SQLITE_READERS: Final = 2


def is_server_url(database: str | os.PathLike[str]) -> bool:
    """Whether ``database`` names a database server rather than a local file."""
    return isinstance(database, str) and database.startswith(POSTGRES_SCHEMES)


def connect(
    database: str | os.PathLike[str],
    *,
    synchronous: Synchronous = "FULL",
    read_only: bool = False,
    decode_cache_bytes: int = DECODE_CACHE_BYTES,
    clock: Clock = SYSTEM,
) -> Store:
    """An unopened store for ``database`` (a path, or a ``postgresql://`` URL).

    ``synchronous`` is SQLite's durability level; a server backend ignores it.
    ``clock``: what SQLite's lease expiry is measured on (a server backend
    compares leases with the server's clock).
    Raises :class:`~storage.errors.StorageError` when the URL names a
    backend this build does not have.
    """
    if not os.fspath(database):
        raise StorageError("database is empty: give a file path or a postgresql:// URL")
    if is_server_url(database):
        assert isinstance(database, str)
        with _postgres(database):
            from storage.postgres import (  # type: ignore[import-not-found, unused-ignore]
                PostgresStore,
            )
        store: Store = PostgresStore(
            database, read_only=read_only, decode_cache_bytes=decode_cache_bytes
        )
        return store
    if isinstance(database, str) and "://" in database:
        scheme = database.split("://", 1)[0]
        raise StorageError(f"database: unknown scheme {scheme!r} (a path, or postgresql://…)")
    return SQLiteStore(
        database,
        synchronous=synchronous,
        readers=SQLITE_READERS,
        read_only=read_only,
        decode_cache_bytes=decode_cache_bytes,
        clock=clock,
    )


def host_channel(
    database: str | os.PathLike[str], *, on_reconnect: Callable[[], None] | None = None
) -> HostChannel:
    """An unopened channel between the hosts sharing the server ``database`` names.

    ``on_reconnect`` is called each time the channel listens again after
    losing its connection (what was sent meanwhile is lost). Raises
    :class:`~storage.errors.StorageError` for a file (its hosts share one
    process: they need no channel) or a backend this build does not have.
    """
    if not is_server_url(database):
        raise StorageError("a host channel needs a database server (a postgresql:// URL)")
    assert isinstance(database, str)
    with _postgres(database):
        from storage.postgres.channel import (  # type: ignore[import-not-found, unused-ignore]
            NotifyChannel,
        )
    channel: HostChannel = NotifyChannel(database, on_reconnect=on_reconnect)
    return channel


@contextlib.contextmanager
def _postgres(database: str) -> Iterator[None]:
    """Around an import of the PostgreSQL backend: its driver missing is a StorageError."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name not in ("storage.postgres", "asyncpg"):
            raise
        raise StorageError(
            f"database {redact(database)}: the PostgreSQL backend is not available"
            f" in this build ({exc.name} is missing)"
        ) from None
