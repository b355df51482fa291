"""Rebuild projections by replaying the log, on PostgreSQL (the twin of :mod:`storage.rebuild`).

The replay runs into a scratch schema of the same database (created, then
dropped), through the same projectors and the same translation as the
writer; the stored dump and the events come from one snapshot.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from storage.errors import ProjectionConflict
from storage.postgres import schema
from storage.postgres.runs import run_ops
from storage.projectors import project
from storage.reads import record_from_row
from storage.schema import PROJECTION_TABLES

__all__ = ["dump_projections", "rebuild_projections"]

Dump = dict[str, list[tuple[Any, ...]]]


async def dump_projections(conn: asyncpg.Connection, namespace: str = "public") -> Dump:
    """Every projection row, sorted, per table."""
    return {
        table: sorted(tuple(r) for r in await conn.fetch(f"SELECT * FROM {namespace}.{table}"))
        for table in PROJECTION_TABLES
    }


async def rebuild_projections(url: str) -> tuple[Dump, Dump]:
    """Return (stored, rebuilt) projection dumps for the database at ``url``."""
    conn = await asyncpg.connect(url)
    scratch = f"sessionrt_rebuild_{uuid.uuid4().hex[:12]}"
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            stored = await dump_projections(conn)
            rows = await conn.fetch(
                "SELECT position, id, aggregate_id, seq, type, created, data FROM event"
                " ORDER BY position"
            )
        await conn.execute(f"CREATE SCHEMA {scratch}")
        try:
            await conn.execute(f"SET search_path = {scratch}")
            await schema.migrate(conn)
            async with conn.transaction():
                for row in rows:
                    record = record_from_row(row)
                    for op in project(record):
                        # Held to its row count as the writer holds it (one op a run).
                        if (refused := await run_ops(conn, [op])) is not None:
                            conflict = refused.conflict()
                            raise ProjectionConflict(
                                op.reason, f"replay of {record.id} failed: {conflict}"
                            )
            rebuilt = await dump_projections(conn, scratch)
        finally:
            await conn.execute("RESET search_path")
            await conn.execute(f"DROP SCHEMA {scratch} CASCADE")
        return stored, rebuilt
    finally:
        await conn.close()
