"""The storage seams, as Protocols: what ``actors/`` and ``server/`` may rely on.

    EventLog      the durable, per-aggregate sequenced log: submit/append
                  commands, read after a seq, read everything after a
                  position, the last seq, live subscribers (after COMMIT)
    SessionReads  the projection reads the runtime and the front door use
                  (sessions, transcript, inbox, claims, open tool calls …)
    Store         both, with the life cycle (open/close, ``async with``)
    HostChannel   messages between hosts that share a database server

:class:`~storage.sqlite.SQLiteStore` is the embedded backend; only
:func:`storage.connect.connect` constructs a store, choosing the backend
by the ``database`` setting. Everything above ``storage`` names these
Protocols, never a backend (``tests/test_layers.py`` checks it).
``tests/storage/test_recorder_contract.py`` is the contract every backend passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Protocol, Self

from protocol import events as ev
from protocol.cursor import MessageAnchor, SessionAnchor, SessionQuery
from protocol.shapes import CompactionMessage, InboxItem, Order, Page, Session, SessionMessage
from storage.lease import Lease
from storage.queries import (
    Boundary,
    Claim,
    DrainStart,
    InstructionInputs,
    InstructionState,
    OpenToolCall,
    Row,
    RunningShell,
    ToolProcess,
)
from storage.recorder import Command, RecordedEvent, Recorder, Subscriber

__all__ = ["BatchObserver", "EventLog", "HostChannel", "SessionReads", "Store"]

#: Called after each commit batch with (commands in it, seconds from hand-off to outcome).
BatchObserver = Callable[[int, float], None]


class EventLog(Recorder, Protocol):
    """The append-only log (the :class:`~storage.recorder.Recorder` contract), as used above."""

    def submit(self, command: Command) -> asyncio.Future[list[RecordedEvent]]:
        """Queue ``command`` without waiting.

        Commands commit in submission order, so a caller may submit several
        and await only the last one it needs to be durable; positions follow
        commit order.
        """
        ...

    async def append(self, command: Command) -> list[RecordedEvent]:
        """Commit ``command`` durably (cancelling the caller does not withdraw it)."""
        ...

    async def read(
        self, aggregate_id: str, *, after: int = 0, limit: int = 512
    ) -> list[RecordedEvent]: ...

    async def read_all(self, *, after: int = 0, limit: int = 512) -> list[RecordedEvent]: ...

    async def last_seq(self, aggregate_id: str) -> int: ...

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]: ...

    @property
    def is_open(self) -> bool:
        """Open, and not yet closing: appends and reads are accepted."""
        ...

    @property
    def batch_observers(self) -> list[BatchObserver]:
        """Observers of each commit batch (the metrics): append and remove freely."""
        ...


class SessionReads(Protocol):
    """Reads of the projections (the :class:`~storage.queries.Queries` surface)."""

    async def session(self, session_id: str) -> Session | None: ...

    async def children(self, session_id: str) -> list[str]: ...

    async def child_sessions(self, session_id: str, limit: int) -> list[Session]:
        """The session's children, oldest first, at most ``limit``."""
        ...

    async def sessions(self, query: SessionQuery, anchor: SessionAnchor | None) -> Page[Session]:
        """One page of sessions ordered by (time_updated, id), continuing from ``anchor``."""
        ...

    async def messages(
        self, session_id: str, order: Order, limit: int, anchor: MessageAnchor | None
    ) -> Page[SessionMessage]:
        """One page of a session's transcript ordered by seq, continuing from ``anchor``."""
        ...

    async def message(self, session_id: str, message_id: str) -> SessionMessage | None: ...

    async def context(self, session_id: str) -> list[SessionMessage]:
        """The active history: from the last completed compaction on (all without one)."""
        ...

    async def full_context(self, session_id: str) -> list[SessionMessage]:
        """:meth:`context` read in full, past any cache (what the cached read must equal)."""
        ...

    async def step_inputs(self, session_id: str) -> tuple[Session | None, list[SessionMessage]]:
        """:meth:`session` and :meth:`context` in one round trip (one snapshot)."""
        ...

    async def drain_start(self, session_id: str) -> DrainStart:
        """The session, what a crash left open in it, its inbox and its instruction
        inputs, in one round trip."""
        ...

    async def newest_message(self, session_id: str) -> str | None: ...

    async def session_count(self) -> tuple[int, int]:
        """(sessions, of which forks)."""
        ...

    async def usage_by_model(self) -> list[Row]:
        """Per model of assistant messages: model JSON, sessions, messages, cost, tokens."""
        ...

    async def message_seq(self, session_id: str, message_id: str) -> int | None:
        """The transcript position of a message, hidden or not; None if absent."""
        ...

    async def held_synthetic(self, session_id: str) -> list[str]:
        """Pending synthetic input admitted since the session's revert was staged."""
        ...

    async def was_cancelled(self, session_id: str, inbox_id: str) -> bool:
        """Whether ``inbox_id`` was cancelled in ``session_id`` and not admitted since."""
        ...

    async def running_shells(self) -> list[RunningShell]:
        """Every shell entry still ``running``, by session and log order."""
        ...

    async def step_snapshots(
        self, session_id: str, from_seq: int = 0
    ) -> list[tuple[int, str, str, tuple[str, ...]]]:
        """(seq, before, after, files) of each writing step from ``from_seq`` on, in log order."""
        ...

    async def step_snapshot(
        self, session_id: str, message_id: str, seq: int
    ) -> tuple[str, str, tuple[str, ...]] | None:
        """(before, after, files) of the step of assistant message ``message_id`` at ``seq``."""
        ...

    async def imports(self) -> list[tuple[str, int]]:
        """Sessions still being imported (hidden until finished), each with its head seq."""
        ...

    async def claims(self, session_id: str | None = None) -> list[Claim]:
        """Sessions holding a write-ahead execution claim, with their leases: all,
        or one session's."""
        ...

    async def leases(self, *, live_at: int | None = None) -> list[Lease]:
        """Every session's lease row (only those live at ``live_at`` ms, when given)."""
        ...

    async def open_tool_calls(self, session_id: str) -> list[OpenToolCall]:
        """Tool parts still streaming or running (stale after a crash or restart)."""
        ...

    async def tool_processes(self, session_id: str | None = None) -> list[ToolProcess]:
        """Process groups of tool calls without a terminal: all, or one session's."""
        ...

    async def running_compaction(self, session_id: str) -> CompactionMessage | None:
        """The session's compaction still ``running`` (a crash or restart cut it off)."""
        ...

    async def permission_requests(self, session_id: str) -> list[ev.PermissionAsked]:
        """The session's unanswered permission requests, oldest first (at most 1,000)."""
        ...

    async def permission_status(self, session_id: str, permission_id: str) -> str | None:
        """``pending``, a reply, or ``expired``; None for an id this session never asked."""
        ...

    async def permission_rules(self, session_id: str) -> list[tuple[str, str]]:
        """``(permission, pattern)`` the session allowed with ``always`` replies, in order."""
        ...

    async def injected_instructions(self, session_id: str) -> list[str]:
        """Paths of the nearby ``AGENTS.md`` files the session was given (once each)."""
        ...

    async def open_step(self, session_id: str) -> str | None:
        """The newest assistant message when its step has no terminal (cut off by a crash)."""
        ...

    async def inbox(self, session_id: str) -> list[InboxItem]: ...

    async def boundary(self, session_id: str) -> Boundary:
        """:meth:`inbox` and :meth:`instruction_inputs` in one round trip (one snapshot)."""
        ...

    async def admission(self, item_id: str) -> InboxItem | None:
        """The admission receipt of ``item_id``, pending or delivered, in any session."""
        ...

    async def instruction_state(self, session_id: str) -> InstructionState | None: ...

    async def instruction_inputs(self, session_id: str) -> InstructionInputs:
        """:meth:`instruction_state` and :meth:`instruction_entries` in one statement."""
        ...

    async def instruction_blobs(self, hashes: Sequence[str]) -> dict[str, str]:
        """The stored canonical JSON of each known hash, read 500 per statement."""
        ...

    async def instruction_entries(self, session_id: str) -> list[tuple[str, str]]:
        """Live (not removed) entries as (key, canonical JSON text), by key."""
        ...


class Store(EventLog, Protocol):
    """A backend: the log, its projections' reads, and the life cycle.

    unopened -> open -> closed; a store opens once, and closing waits for
    every submitted command to commit (or fail) first.
    """

    @property
    def queries(self) -> SessionReads: ...

    @property
    def path(self) -> str | None:
        """The local database file (its companions share the prefix); None for a server."""
        ...

    @property
    def read_only(self) -> bool: ...

    @property
    def exclusive(self) -> bool:
        """Whether only this process can write the log (SQLite's writer lock):
        then nothing changes a projection but this process's own commands."""
        ...

    async def check_writable(
        self, timeout_s: float, blocking: Callable[..., Awaitable[None]]
    ) -> None:
        """Raise :class:`~storage.errors.StorageBrokenError` unless a write could commit now.

        Writes nothing; waits at most about ``timeout_s``; ``blocking`` runs
        blocking work off the loop (the caller owns its threads).
        """
        ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class HostChannel(Protocol):
    """Messages between the hosts of one database server, at most once, without reply.

    :func:`storage.connect.host_channel` hands one out; ``open`` before use,
    ``close`` after the last publish. A message published while a host does
    not listen (it is gone, or its connection is being made again) never
    reaches it: callers must not depend on one arriving.
    """

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, target: str | None, origin: str, body: str) -> None:
        """Send ``body`` from ``origin`` to host ``target`` (to every other host when None).

        Raises :class:`~storage.errors.StorageError` for a body over the
        channel's limit, :class:`~storage.errors.StorageBrokenError` when the
        server cannot be reached.
        """
        ...

    def subscribe(self, host_id: str, handler: Callable[[str], None]) -> Callable[[], None]:
        """Hand ``handler`` the bodies sent to ``host_id`` and the broadcasts of
        other hosts; returns the unsubscribe function."""
        ...
