"""The append-only SQLite event log and its projections. Depends on protocol only."""

from storage._url import is_postgres_url, redact
from storage._writer import Synchronous
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
from storage.queries import Claim, OpenToolCall, Queries, RunningShell, ToolProcess
from storage.rebuild import dump_projections, rebuild_projections
from storage.recorder import (
    Command,
    EntryWrite,
    NewEvent,
    RecordedEvent,
    Recorder,
    Subscriber,
    now_ms,
)
from storage.schema import SCHEMA_VERSION
from storage.sqlite import SQLiteStore

__all__ = [
    "SCHEMA_VERSION",
    "AppendConflictError",
    "Claim",
    "Command",
    "DivergedError",
    "EntryWrite",
    "NewEvent",
    "OpenToolCall",
    "ProjectionConflict",
    "Queries",
    "RecordedEvent",
    "Recorder",
    "RunningShell",
    "SQLiteStore",
    "SeqConflictError",
    "StorageBrokenError",
    "StorageError",
    "StoreClosedError",
    "StoreLockedError",
    "Subscriber",
    "Synchronous",
    "ToolProcess",
    "dump_projections",
    "is_postgres_url",
    "now_ms",
    "rebuild_projections",
    "redact",
]
