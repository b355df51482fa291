"""PostgreSQL for tests: a uniquely named, migrated database per test, dropped after it.

The server is ``SESSIONRT_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432``,
trust auth). One template database per pytest process (its name holds the
xdist worker id) is migrated once; each test's database is a copy of it
(``CREATE DATABASE … TEMPLATE``, tens of milliseconds), so tests never see
each other's rows and parallel workers never share a name. An unreachable
server skips the test with the reason; CI machines have one, so there it runs.

``SESSIONRT_TEST_DATABASE=postgresql`` makes the shared ``store`` fixture (and
everything built on it) use PostgreSQL instead of a SQLite file.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Final

import pytest

SERVER: Final = os.environ.get("SESSIONRT_TEST_PG", "postgresql://postgres@127.0.0.1:5432")

_template: str | None = None


def on_postgres() -> bool:
    """True when the suite's second pass runs the log on PostgreSQL."""
    return os.environ.get("SESSIONRT_TEST_DATABASE", "").startswith("postgres")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


async def _admin() -> object:
    asyncpg = pytest.importorskip(
        "asyncpg", reason="asyncpg is not installed (sessionrt[postgres])"
    )
    try:
        return await asyncpg.connect(f"{SERVER}/postgres", timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.skip(f"no PostgreSQL server at {SERVER}: {type(exc).__name__}: {exc}")


async def _ensure_template() -> str:
    # Tests of one process run one at a time: no lock needed around this.
    global _template
    if _template is not None:
        return _template
    import asyncpg

    from storage.postgres import schema

    name = f"sessionrt_tmpl_{_worker()}_{os.getpid()}"
    admin = await _admin()
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')  # type: ignore[attr-defined]
        await admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[attr-defined]
    finally:
        await admin.close()  # type: ignore[attr-defined]
    conn = await asyncpg.connect(f"{SERVER}/{name}")
    try:
        await schema.migrate(conn)
    finally:
        await conn.close()
    _template = name
    return name


def template_made() -> bool:
    return _template is not None


async def drop_templates() -> None:
    """Drop this process's template database (at the end of the session)."""
    global _template
    if _template is None:
        return
    admin = await _admin()
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{_template}" WITH (FORCE)')  # type: ignore[attr-defined]
    finally:
        await admin.close()  # type: ignore[attr-defined]
    _template = None


async def new_database(*, migrated: bool = True) -> str:
    """The URL of a fresh database of its own (migrated unless told otherwise)."""
    template = await _ensure_template() if migrated else "template0"
    name = f"sessionrt_t_{_worker()}_{uuid.uuid4().hex[:12]}"
    admin = await _admin()
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')  # type: ignore[attr-defined]
    finally:
        await admin.close()  # type: ignore[attr-defined]
    return f"{SERVER}/{name}"


async def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin = await _admin()
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[attr-defined]
    finally:
        await admin.close()  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def database(*, migrated: bool = True) -> AsyncIterator[str]:
    """``async with database() as url``: a fresh database's URL, dropped afterwards."""
    url = await new_database(migrated=migrated)
    try:
        yield url
    finally:
        await drop_database(url)


async def stored_and_rebuilt(store: object) -> tuple[object, object]:
    """(stored, rebuilt) projection dumps of ``store``'s database, open or closed, on
    either backend: what "replaying the log rebuilds every projection" compares."""
    import asyncio

    from storage import rebuild_projections

    if type(store).__name__ == "PostgresStore":
        from storage.postgres.rebuild import rebuild_projections as rebuild_pg

        return await rebuild_pg(store._url)  # type: ignore[attr-defined]
    return await asyncio.to_thread(rebuild_projections, str(store.path))  # type: ignore[attr-defined]
