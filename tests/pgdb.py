"""PostgreSQL for tests: a clean, migrated database per test, made once and reused.

The server is ``SESSIONRT_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432``,
trust auth). One template database per pytest process (its name holds the
xdist worker id and the pid, so parallel workers and parallel runs never share
a name) is migrated once; the databases tests get are copies of it
(``CREATE DATABASE … TEMPLATE``). Dropping a database makes the server
checkpoint (2 to 2.6 s each on CI), so a database a test is done with is emptied
instead (its other connections ended, every table it wrote to truncated, its
sequences restarted) and handed to the next test of the same
process. It is reused only when its catalog is still the template's (tables,
columns, functions, extensions, settings, schema version); a test that
changed any of that leaves it to be dropped. Every database the process made
is dropped at the end of the session (:func:`drop_all`). An unreachable server
skips the test with the reason; CI machines have one, so there it runs.

Every database made here commits without waiting for its WAL flush
(``synchronous_commit = off``, a setting of the database): a commit still
happens whole and in order, and is seen by every later statement and
connection; only a crash of the PostgreSQL server itself could lose the last
ones, which no test does. A flushed commit cost 3 to 6 ms on CI, 0.5 ms so.

Which backend a test's log is on (:func:`on_postgres`): the ``backend``
fixture's (tests/conftest.py: the runtime, sessions and shell tests run once
per backend), else ``SESSIONRT_TEST_DATABASE=postgresql`` puts the shared
``store`` fixture (and everything built on it) on PostgreSQL for the whole run.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import pytest

SERVER: Final = os.environ.get("SESSIONRT_TEST_PG", "postgresql://postgres@127.0.0.1:5432")

_template: str | None = None
#: The template's catalog, what a database must still have to be reused.
_template_catalog: str | None = None
#: Clean migrated databases of this process, ready for the next test.
_free: list[str] = []
#: Every database this process made and has not dropped yet.
_made: list[str] = []
#: The backend of the test running in this process, set by the ``backend`` fixture.
_current: str | None = None

#: What a test could change beyond rows: relations and their columns, functions,
#: extensions, schemas, per-database settings and the schema version.
_CATALOG: Final = """
SELECT string_agg(x, E'\\n' ORDER BY x) FROM (
    SELECT 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
    UNION ALL
    SELECT 'col ' || a.attrelid::regclass::text || '.' || a.attname || ' '
        || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'fn ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public'
    UNION ALL
    SELECT 'trg ' || t.tgrelid::regclass::text || '.' || t.tgname
    FROM pg_trigger t WHERE NOT t.tgisinternal
    UNION ALL SELECT 'ext ' || extname || ' ' || extversion FROM pg_extension
    UNION ALL SELECT 'ns ' || nspname FROM pg_namespace
    UNION ALL
    SELECT 'set ' || array_to_string(s.setconfig, ',')
    FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
    WHERE d.datname = current_database()
    UNION ALL SELECT 'version ' || version::text FROM schema_version
) AS catalog(x)
"""


def everything_on_postgres() -> bool:
    """True when ``SESSIONRT_TEST_DATABASE=postgresql`` puts the whole run's log on PostgreSQL."""
    return os.environ.get("SESSIONRT_TEST_DATABASE", "").startswith("postgres")


def on_postgres() -> bool:
    """True when the running test's log is on PostgreSQL (see :func:`using`)."""
    if _current is not None:
        return _current == "postgresql"
    return everything_on_postgres()


@contextlib.contextmanager
def using(backend: str) -> Iterator[None]:
    """The running test's backend (``"sqlite"`` or ``"postgresql"``) while inside."""
    global _current
    previous, _current = _current, backend
    try:
        yield
    finally:
        _current = previous


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


async def _admin() -> Any:
    asyncpg = pytest.importorskip(
        "asyncpg", reason="asyncpg is not installed (sessionrt[postgres])"
    )
    try:
        return await asyncpg.connect(f"{SERVER}/postgres", timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.skip(f"no PostgreSQL server at {SERVER}: {type(exc).__name__}: {exc}")


async def _ensure_template() -> str:
    # Tests of one process run one at a time: no lock needed around this.
    global _template, _template_catalog
    if _template is not None:
        return _template
    import asyncpg

    from storage.postgres import schema

    name = f"sessionrt_tmpl_{_worker()}_{os.getpid()}"
    admin = await _admin()
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
        await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await admin.close()
    _made.append(name)  # dropped at the end even if migrating it fails
    conn = await asyncpg.connect(f"{SERVER}/{name}")
    try:
        await schema.migrate(conn)
        _template_catalog = await conn.fetchval(_CATALOG)
    finally:
        await conn.close()
    _template = name
    return name


def template_made() -> bool:
    return bool(_made)


async def drop_all() -> None:
    """Drop every database this process made, and its template (at the session's end)."""
    global _template
    if not _made:
        return
    admin = await _admin()
    try:
        for name in reversed(_made):  # the template last: its copies first
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
    _made.clear()
    _free.clear()
    _template = None


async def new_database(*, migrated: bool = True) -> str:
    """The URL of a clean database of the caller's own (migrated unless told otherwise);
    :func:`release` it when done. Dropped at the session's end at the latest."""
    if migrated and _free:
        return f"{SERVER}/{_free.pop()}"
    template = await _ensure_template() if migrated else "template0"
    # "c" for a copy of the template, the only kind reused; "e" for an empty one.
    kind = "c" if migrated else "e"
    name = f"sessionrt_t_{_worker()}_{os.getpid()}_{kind}{uuid.uuid4().hex[:8]}"
    admin = await _admin()
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        # A database's settings are not copied with it: the same as the template's.
        await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await admin.close()
    _made.append(name)
    return f"{SERVER}/{name}"


async def release(url: str) -> None:
    """Empty a database from :func:`new_database` for the next test of this process, or,
    if its catalog is no longer the template's, leave it to be dropped at the end."""
    import asyncpg

    name = url.rsplit("/", 1)[1]
    admin = await _admin()
    try:
        # Connections the test left open would hold locks TRUNCATE waits on.
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await admin.close()
    if not name.startswith(f"sessionrt_t_{_worker()}_{os.getpid()}_c"):
        return  # not a copy of the template (one made from template0)
    conn = await asyncpg.connect(url)
    try:
        try:
            catalog = await conn.fetchval(_CATALOG)
        except asyncpg.PostgresError:
            return  # schema_version is gone: not the template's
        if catalog != _template_catalog:
            return
        # Only what the test wrote to (truncating all 13 tables took 0.4 s): a table
        # is empty on disk until its first row, and truncating makes it so again,
        # indexes too (what tests counting index entries rely on).
        written = await conn.fetch(
            "SELECT c.oid::regclass::text AS t FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'r'"
            " AND c.relname <> 'schema_version' AND pg_relation_size(c.oid) > 0"
        )
        await conn.execute("SET lock_timeout = '10s'")
        if written:
            listed = ", ".join(r["t"] for r in written)
            await conn.execute(f"TRUNCATE {listed} RESTART IDENTITY CASCADE")
        for r in await conn.fetch(
            "SELECT quote_ident(sequencename) AS s FROM pg_sequences"
            " WHERE schemaname = 'public' AND last_value IS NOT NULL"
        ):
            await conn.execute(f"ALTER SEQUENCE {r['s']} RESTART")
    finally:
        await conn.close()
    _free.append(name)


@contextlib.asynccontextmanager
async def database(*, migrated: bool = True) -> AsyncIterator[str]:
    """``async with database() as url``: a clean database's URL, emptied for reuse afterwards."""
    url = await new_database(migrated=migrated)
    try:
        yield url
    finally:
        await release(url)


async def stored_and_rebuilt(store: object) -> tuple[object, object]:
    """(stored, rebuilt) projection dumps of ``store``'s database, open or closed, on
    either backend: what "replaying the log rebuilds every projection" compares."""
    import asyncio

    from storage import rebuild_projections

    if type(store).__name__ == "PostgresStore":
        from storage.postgres.rebuild import rebuild_projections as rebuild_pg

        return await rebuild_pg(store._url)  # type: ignore[attr-defined]
    return await asyncio.to_thread(rebuild_projections, str(store.path))  # type: ignore[attr-defined]
