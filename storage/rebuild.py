"""Rebuild projections by replaying the log, and compare them with the stored ones.

Replay is the proof that projections are derived data: replaying every event
from position 1 through the same projectors into an empty schema must give
exactly the rows the writer maintained incrementally. Tests and the crash
simulator use this; it is synchronous (a tool, not a request path), so call
it from a thread when an event loop is running.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from storage._writer import migrate
from storage.errors import ProjectionConflict
from storage.projectors import project
from storage.reads import record_from_row
from storage.schema import PROJECTION_TABLES

__all__ = ["dump_projections", "rebuild_projections"]

Dump = dict[str, list[tuple[Any, ...]]]


def dump_projections(conn: sqlite3.Connection) -> Dump:
    """Every projection row, sorted, per table."""
    return {
        table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall())
        for table in PROJECTION_TABLES
    }


def rebuild_projections(path: str) -> tuple[Dump, Dump]:
    """Return (stored, rebuilt) projection dumps for the database at ``path``.

    Opens ``path`` read-only; the rebuild happens in a private in-memory database.
    """
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    target = sqlite3.connect(":memory:", isolation_level=None)
    try:
        source.execute("BEGIN")  # one snapshot for both the dump and the replay
        stored = dump_projections(source)
        target.execute("PRAGMA foreign_keys = ON")
        migrate(target)
        target.execute("BEGIN")
        rows = source.execute(
            "SELECT position, id, aggregate_id, seq, type, created, data FROM event"
            " ORDER BY position"
        )
        for row in rows:
            record = record_from_row(row)
            for op in project(record):
                cursor = target.execute(op.sql, op.params)
                if op.expect is not None and cursor.rowcount != op.expect:
                    conflict = op.conflict()
                    raise ProjectionConflict(op.reason, f"replay of {record.id} failed: {conflict}")
        target.execute("COMMIT")
        source.execute("COMMIT")
        return stored, dump_projections(target)
    finally:
        source.close()
        target.close()
