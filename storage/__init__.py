"""The append-only SQLite event log and its projections. Depends on protocol only."""

from storage._writer import Synchronous
from storage.errors import (
    AppendConflictError,
    DivergedError,
    FencedError,
    LeaseHeldError,
    ProjectionConflict,
    SeqConflictError,
    StorageBrokenError,
    StorageError,
    StoreClosedError,
    StoreLockedError,
)
from storage.lease import Fence, Lease, LeaseUse, default_host_id, fenced
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
    "Fence",
    "FencedError",
    "Lease",
    "LeaseHeldError",
    "LeaseUse",
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
    "default_host_id",
    "dump_projections",
    "fenced",
    "now_ms",
    "rebuild_projections",
]
