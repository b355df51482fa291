"""The append-only event log and its projections. Depends on protocol only.

Above this package, name the Protocols (:class:`EventLog`, :class:`SessionReads`,
:class:`Store`, :class:`HostChannel`) and open a store with :func:`connect`, a
channel between hosts with :func:`host_channel`; never a backend.
"""

from storage._ops import Op, no_staged_revert
from storage._url import redact
from storage._writer import Synchronous
from storage.connect import connect, host_channel, is_server_url
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
from storage.follow import FollowDispatcher, LogFollow
from storage.interfaces import BatchObserver, EventLog, HostChannel, SessionReads, Store
from storage.lease import Fence, Lease, LeaseUse, default_host_id, fenced
from storage.queries import (
    Boundary,
    Claim,
    DrainStart,
    OpenToolCall,
    Queries,
    RunningShell,
    ToolProcess,
)
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
from storage.schema import SCHEMA_VERSION, SESSION_BUCKET_MS
from storage.sqlite import SQLiteStore

__all__ = [
    "SCHEMA_VERSION",
    "SESSION_BUCKET_MS",
    "AppendConflictError",
    "BatchObserver",
    "Boundary",
    "Claim",
    "Command",
    "DivergedError",
    "DrainStart",
    "EntryWrite",
    "EventLog",
    "Fence",
    "FencedError",
    "FollowDispatcher",
    "HostChannel",
    "Lease",
    "LeaseHeldError",
    "LeaseUse",
    "LogFollow",
    "NewEvent",
    "Op",
    "OpenToolCall",
    "ProjectionConflict",
    "Queries",
    "RecordedEvent",
    "Recorder",
    "RunningShell",
    "SQLiteStore",
    "SeqConflictError",
    "SessionReads",
    "StorageBrokenError",
    "StorageError",
    "Store",
    "StoreClosedError",
    "StoreLockedError",
    "Subscriber",
    "Synchronous",
    "ToolProcess",
    "connect",
    "default_host_id",
    "dump_projections",
    "fenced",
    "host_channel",
    "is_server_url",
    "no_staged_revert",
    "now_ms",
    "rebuild_projections",
    "redact",
]
