"""One schema for both backends, and the databases of the build before it.

``old_schema/*.sql`` are the migrations as that build wrote them, twice
(SQLite's, then PostgreSQL's re-typed copy), verbatim. A database made from
them at some version must open with this build, migrate to
:data:`SCHEMA_VERSION`, keep its rows, take new appends, and end up with the
same tables, columns, types, indexes and constraints as a database this
build makes from nothing.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pgdb import database

from protocol import Location, encode_data, stored_type
from protocol import events as ev
from storage import SCHEMA_VERSION, Command, SQLiteStore, StorageBrokenError, connect
from storage.schema import MIGRATIONS, POSTGRES_TYPES

OLD = Path(__file__).parent / "old_schema"
#: Versions an old database is made at: before the lease tables, and the last.
VERSIONS = (8, 15)


def old_migrations(backend: str) -> list[str]:
    """The previous build's migrations of ``backend``, version 1 first."""
    text = (OLD / f"{backend}.sql").read_text()
    return re.split(r"^-- version \d+\n", text, flags=re.M)[1:]


def test_one_list_of_migrations_serves_both_backends_typed_in_one_place() -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION >= len(old_migrations("sqlite"))
    sqlite_words = re.compile(r"\b(" + "|".join(POSTGRES_TYPES) + r")\b")
    for migration in MIGRATIONS:
        assert migration.script("sqlite") == migration.both + migration.sqlite
        shared = migration.script("postgres").removesuffix(migration.postgres)
        assert sqlite_words.search(shared) is None, shared


def _created() -> ev.SessionCreated:
    return ev.SessionCreated(session_id="ses_old", title="kept", location=Location(directory="/"))


async def _kept_and_writable(store: Any) -> None:
    """The old database, migrated: its rows read back, and an append goes after them."""
    assert await store.fetch("SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    [record] = await store.read("ses_old")
    assert record.event == _created()
    session = await store.queries.session("ses_old")
    assert session is not None
    assert session.title == "kept"
    [renamed] = await store.append(Command.of(ev.SessionRenamed(session_id="ses_old", title="x")))
    assert renamed.seq == 2
    assert renamed.position > record.position


# -- SQLite -------------------------------------------------------------------------------------


def _sqlite_shape(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        objects = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
            " WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
        shape: list[tuple[Any, ...]] = [
            (t, n, tbl, " ".join((sql or "").split())) for t, n, tbl, sql in objects
        ]
        for _, name, _, _ in objects:
            shape += [("column", name, *c) for c in conn.execute(f"PRAGMA table_xinfo({name})")]
        return shape
    finally:
        conn.close()


def _old_sqlite(path: Path, version: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for script in old_migrations("sqlite")[:version]:
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
        event = _created()
        conn.execute(
            "INSERT INTO event (position, id, aggregate_id, seq, type, created, data)"
            " VALUES (1, 'evt_old', 'ses_old', 1, ?, 1, ?)",
            (stored_type(event), encode_data(event).decode()),
        )
        conn.execute(
            "INSERT INTO session (id, title, directory, time_created, time_updated)"
            " VALUES ('ses_old', 'kept', '/', 1, 1)"
        )
    finally:
        conn.close()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("version", VERSIONS)
async def test_a_sqlite_database_of_the_previous_build_migrates_to_this_schema(
    tmp_path: Path, version: int
) -> None:
    old, fresh = tmp_path / "old.sqlite", tmp_path / "fresh.sqlite"
    _old_sqlite(old, version)
    async with SQLiteStore(old) as store:
        await _kept_and_writable(store)
    async with SQLiteStore(fresh):
        pass
    assert _sqlite_shape(old) == _sqlite_shape(fresh)


# -- PostgreSQL ---------------------------------------------------------------------------------

#: The catalog, as far as the schema shapes it (no names the server makes up).
_PG_SHAPE = (
    "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
    " column_default, is_generated, generation_expression FROM information_schema.columns"
    " WHERE table_schema = 'public' ORDER BY 1, 2",
    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2",
    "SELECT relname, relkind, relpersistence FROM pg_class"
    " WHERE relnamespace = 'public'::regnamespace ORDER BY 1",
    "SELECT sequencename, data_type FROM pg_sequences WHERE schemaname = 'public' ORDER BY 1",
    "SELECT proname, prokind, pg_get_function_identity_arguments(oid), prosrc FROM pg_proc"
    " WHERE pronamespace = 'public'::regnamespace ORDER BY 1, 3",
)


async def _pg_shape(url: str) -> list[list[tuple[Any, ...]]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [[tuple(r) for r in await conn.fetch(sql)] for sql in _PG_SHAPE]
    finally:
        await conn.close()


async def _old_postgres(url: str, version: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE schema_version (version BIGINT NOT NULL)")
        for script in old_migrations("postgres")[:version]:
            await conn.execute(script)
        await conn.execute("INSERT INTO schema_version VALUES ($1)", version)
        event = _created()
        # As that build's writer did: the position from the column's default.
        await conn.execute(
            "INSERT INTO event (id, aggregate_id, seq, type, created, data)"
            " VALUES ('evt_old', 'ses_old', 1, $1, 1, $2)",
            stored_type(event),
            encode_data(event).decode(),
        )
        await conn.execute(
            "INSERT INTO session (id, title, directory, time_created, time_updated)"
            " VALUES ('ses_old', 'kept', '/', 1, 1)"
        )
    finally:
        await conn.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_postgres_database_of_the_previous_build_migrates_to_this_schema(
    version: int,
) -> None:
    async with database(migrated=False) as old, database() as fresh:
        await _old_postgres(old, version)
        if version < SCHEMA_VERSION:
            with pytest.raises(StorageBrokenError, match=f"schema version {version}"):
                async with connect(old, read_only=True):
                    pass
        async with connect(old) as store:
            await _kept_and_writable(store)
        assert await _pg_shape(old) == await _pg_shape(fresh)
