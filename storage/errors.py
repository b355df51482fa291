"""Storage failures.

    StorageError                 base
    ├── StoreClosedError         we closed the store (or never opened it)
    ├── StoreLockedError         another process owns the database's writer (busy)
    ├── StorageBrokenError       the environment broke: I/O, disk full, corruption
    └── AppendConflictError      one command cannot commit; others in its batch still do
        ├── SeqConflictError     the aggregate is not at the expected seq
        ├── DivergedError        an already-stored (aggregate, seq) differs from the replay
        ├── ProjectionConflict   a projector's precondition failed (e.g. a second cancel)
        ├── FencedError          the command's lease epoch is no longer this host's
        └── LeaseHeldError       another host holds a live lease on the session

sqlite3 errors never leave this package: they are translated here.
"""

from __future__ import annotations

__all__ = [
    "AppendConflictError",
    "DivergedError",
    "FencedError",
    "LeaseHeldError",
    "ProjectionConflict",
    "SeqConflictError",
    "StorageBrokenError",
    "StorageError",
    "StoreClosedError",
    "StoreLockedError",
]


class StorageError(Exception):
    """Base of storage failures."""


class StoreClosedError(StorageError):
    """The store is not open (closed by us, or never opened)."""


class StoreLockedError(StorageError):
    """Another process holds the single-writer lock of this database."""


class StorageBrokenError(StorageError):
    """The database failed underneath us; the batch did not commit."""


class AppendConflictError(StorageError):
    """A command was rejected; nothing of it was stored."""


class SeqConflictError(AppendConflictError):
    def __init__(self, aggregate_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{aggregate_id}: expected to append after seq {expected}, log is at {actual}"
        )
        self.aggregate_id = aggregate_id
        self.expected = expected
        self.actual = actual


class DivergedError(AppendConflictError):
    def __init__(self, aggregate_id: str, seq: int, detail: str) -> None:
        super().__init__(f"{aggregate_id} seq {seq} diverged: {detail}")
        self.aggregate_id = aggregate_id
        self.seq = seq


class ProjectionConflict(AppendConflictError):
    """A projector refused an event; ``reason`` is a stable machine-readable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class FencedError(AppendConflictError):
    """The command carried a lease (host, epoch) that is no longer current.

    The execution that gets it lost its lease (it expired, or another host
    took it over with a higher epoch): it must stop without writing more.
    """

    def __init__(self, session_id: str, host_id: str, epoch: int, detail: str) -> None:
        super().__init__(f"{session_id}: lease epoch {epoch} of host {host_id} is fenced: {detail}")
        self.session_id = session_id
        self.host_id = host_id
        self.epoch = epoch


class LeaseHeldError(AppendConflictError):
    """Another host holds a live lease on the session: it runs there."""

    def __init__(self, session_id: str, owner: str, epoch: int) -> None:
        super().__init__(f"{session_id} is leased by host {owner} (epoch {epoch})")
        self.session_id = session_id
        self.owner = owner
        self.epoch = epoch
