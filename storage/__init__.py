"""The append-only SQLite event log and its projections. Depends on protocol only."""

from storage.errors import (
    AppendConflictError,
    DivergedError,
    ProjectionConflict,
    SeqConflictError,
    StorageBrokenError,
    StorageError,
    StoreClosedError,
    StoreLockedError,
)
from storage.queries import Queries
from storage.rebuild import dump_projections, rebuild_projections
from storage.recorder import Command, NewEvent, RecordedEvent, Recorder, Subscriber, now_ms
from storage.schema import SCHEMA_VERSION
from storage.sqlite import SQLiteStore

__all__ = [
    "SCHEMA_VERSION",
    "AppendConflictError",
    "Command",
    "DivergedError",
    "NewEvent",
    "ProjectionConflict",
    "Queries",
    "RecordedEvent",
    "Recorder",
    "SQLiteStore",
    "SeqConflictError",
    "StorageBrokenError",
    "StorageError",
    "StoreClosedError",
    "StoreLockedError",
    "Subscriber",
    "dump_projections",
    "now_ms",
    "rebuild_projections",
]
