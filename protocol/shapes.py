"""Public shapes: the values operations return and clients decode.

Wire names follow :mod:`protocol.codec` (``session_id`` <-> ``sessionID``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Literal, TypeVar

import attrs

__all__ = [
    "AssistantMessage",
    "CompactionMessage",
    "Delivery",
    "FileAttachment",
    "FileDiff",
    "FileSource",
    "ForkBoundary",
    "InboxItem",
    "InboxItemType",
    "InstructionEntry",
    "Location",
    "MessageTime",
    "ModelRef",
    "ModelUsage",
    "Order",
    "Page",
    "PageCursor",
    "ReasoningPart",
    "RetryState",
    "Session",
    "SessionExport",
    "SessionMessage",
    "SessionRevert",
    "SessionStats",
    "SessionTime",
    "ShellInfo",
    "ShellMessage",
    "SyntheticMessage",
    "SystemMessage",
    "TextPart",
    "Tokens",
    "ToolPart",
    "UserMessage",
]

T = TypeVar("T")

Delivery = Literal["steer", "queue"]
InboxItemType = Literal["user", "synthetic", "compaction", "move"]
Order = Literal["asc", "desc"]


@attrs.frozen(kw_only=True)
class ModelRef:
    id: str = attrs.field(metadata={"schema": {"type": "string", "minLength": 1}})
    provider_id: str = attrs.field(metadata={"schema": {"type": "string", "minLength": 1}})
    variant: str | None = None


@attrs.frozen(kw_only=True)
class Location:
    #: An absolute path (a relative one is refused).
    directory: str = attrs.field(metadata={"schema": {"type": "string", "pattern": "^/"}})


@attrs.frozen(kw_only=True)
class CacheTokens:
    read: int = 0
    write: int = 0


@attrs.frozen(kw_only=True)
class Tokens:
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache: CacheTokens = attrs.field(factory=CacheTokens)


@attrs.frozen(kw_only=True)
class SessionTime:
    created: int
    updated: int
    #: When the session last went idle (an execution's terminal, not a
    #: shutdown), epoch ms; strictly increasing, so "unread" is ``idle > viewed``.
    idle: int | None = None
    #: The newest idle watermark a client marked viewed (``session.view``).
    viewed: int | None = None


@attrs.frozen(kw_only=True)
class ForkBoundary:
    """Where a fork cuts its parent's transcript.

    ``before``: the messages strictly before ``message_id``; ``through``: up to
    and including it. ``through`` without a message is a fork of a parent that
    had no messages yet.
    """

    type: Literal["before", "through"]
    message_id: str | None = None


@attrs.frozen(kw_only=True)
class RetryState:
    """A scheduled retry of a model call: which message, which attempt, when, why."""

    assistant_message_id: str
    #: The retry's number, from 1 (the first retry is the second attempt).
    attempt: int
    #: When the retry fires, epoch ms.
    at: int
    error: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Session:
    id: str
    parent_id: str | None = None
    title: str
    agent: str | None = None
    model: ModelRef | None = None
    location: Location
    metadata: Mapping[str, Any] | None = None
    time: SessionTime
    tokens: Tokens = attrs.field(factory=Tokens)
    cost: float = 0.0
    #: The retry the session is waiting for, if any (``session.retry.scheduled``);
    #: later activity or the execution's terminal clears it.
    retry: RetryState | None = None
    #: A staged revert (``session.revert.staged``) until it is cleared or committed.
    revert: SessionRevert | None = None
    #: The session this one was forked from, and where (``session.forked``).
    fork_session_id: str | None = None
    fork_boundary: ForkBoundary | None = None


@attrs.frozen(kw_only=True)
class SessionRevert:
    """A staged revert: the transcript from ``message_id`` on is hidden.

    ``snapshot`` is the tree the files were in when the revert was staged (what
    a clear restores) and ``files`` the paths it restored; both are absent for
    a transcript-only revert.
    """

    message_id: str
    snapshot: str | None = None
    files: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class ShellInfo:
    """A user shell command (``session.shell``)."""

    id: str
    command: str
    #: ``running``, then ``completed`` / ``failed`` (exit ≠ 0 or no start) / ``cancelled``.
    state: Literal["running", "completed", "failed", "cancelled"] = "running"
    exit: int | None = None
    time_started: int
    time_ended: int | None = None
    #: Why it ended before its command did: ``interrupted`` (the session was
    #: interrupted), ``cancelled`` (``DELETE …/shell/{shellID}``), ``timeout``
    #: (``[runtime] shell_timeout_s``), ``restart`` (the server stopped meanwhile).
    reason: Literal["interrupted", "cancelled", "timeout", "restart"] | None = None


@attrs.frozen(kw_only=True)
class FileDiff:
    """One file's change between two snapshots (``session.diff``)."""

    file: str
    status: Literal["added", "deleted", "modified"]
    additions: int
    deletions: int
    #: The unified diff text; empty for binary files.
    patch: str
    binary: bool = False


@attrs.frozen(kw_only=True)
class FileSource:
    type: Literal["inline", "uri"]
    uri: str | None = None


@attrs.frozen(kw_only=True)
class FileAttachment:
    """A file as admitted: always materialised to base64 ``data``."""

    data: str
    mime: str
    source: FileSource
    name: str | None = None


@attrs.frozen(kw_only=True)
class InboxItem:
    """A pending (or, as a receipt, an admitted) input of a session.

    ``payload`` is the admitted content: for ``user`` ``{text, files?,
    metadata?}``, for ``synthetic`` ``{text, description?, metadata?}``.
    """

    id: str
    session_id: str
    type: InboxItemType
    delivery: Delivery
    time_created: int
    payload: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class MessageTime:
    created: int
    updated: int


@attrs.frozen(kw_only=True)
class UserMessage:
    type: Literal["user"] = "user"
    id: str
    session_id: str
    seq: int
    time: MessageTime
    text: str
    files: tuple[FileAttachment, ...] | None = None
    metadata: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SyntheticMessage:
    type: Literal["synthetic"] = "synthetic"
    id: str
    session_id: str
    seq: int
    time: MessageTime
    text: str
    description: str | None = None
    metadata: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class TextPart:
    type: Literal["text"] = "text"
    ordinal: int
    text: str


@attrs.frozen(kw_only=True)
class ReasoningPart:
    type: Literal["reasoning"] = "reasoning"
    ordinal: int
    text: str


@attrs.frozen(kw_only=True)
class ToolPart:
    type: Literal["tool"] = "tool"
    id: str
    name: str
    status: Literal["streaming", "running", "completed", "error"]
    input: Mapping[str, Any] | None = None
    content: tuple[Mapping[str, Any], ...] | None = None
    error: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class AssistantMessage:
    type: Literal["assistant"] = "assistant"
    id: str
    session_id: str
    seq: int
    time: MessageTime
    agent: str | None = None
    model: ModelRef | None = None
    parts: tuple[TextPart | ReasoningPart | ToolPart, ...] = ()
    finish: str | None = None
    error: Mapping[str, Any] | None = None
    tokens: Tokens | None = None
    cost: float | None = None
    #: Provider-native continuation state of the step (e.g. reasoning
    #: signatures): replayed only to the same provider and model.
    provider_state: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SystemMessage:
    """A chronological instruction update, its text frozen when it was admitted."""

    type: Literal["system"] = "system"
    id: str
    session_id: str
    seq: int
    time: MessageTime
    text: str
    #: The instruction source keys whose change the text announces.
    keys: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class ShellMessage:
    """A user shell command and (once it ended) its bounded output."""

    type: Literal["shell"] = "shell"
    id: str
    session_id: str
    seq: int
    time: MessageTime
    shell: ShellInfo
    output: str | None = None


@attrs.frozen(kw_only=True)
class CompactionMessage:
    """A compaction's transcript row: ``running`` until it ends or fails.

    A ``completed`` one is the active history's boundary: the model sees its
    summary ``text`` and the serialized ``recent`` tail, then what follows it.
    """

    type: Literal["compaction"] = "compaction"
    id: str
    session_id: str
    seq: int
    time: MessageTime
    status: Literal["running", "completed", "failed"]
    reason: Literal["auto", "manual"]
    text: str | None = None
    recent: str | None = None
    error: Mapping[str, Any] | None = None
    input_id: str | None = None


SessionMessage = (
    UserMessage
    | SyntheticMessage
    | AssistantMessage
    | SystemMessage
    | ShellMessage
    | CompactionMessage
)


@attrs.frozen(kw_only=True)
class InstructionEntry:
    """An API-managed instruction value; its source key is ``api/<key>``."""

    key: str
    value: Any


@attrs.frozen(kw_only=True)
class PageCursor:
    previous: str | None = None
    next: str | None = None


@attrs.frozen(kw_only=True)
class Page(Generic[T]):
    """A bounded ordered result; each cursor continues the same query."""

    data: tuple[T, ...]
    cursor: PageCursor = attrs.field(factory=PageCursor)


@attrs.frozen(kw_only=True)
class SessionExport:
    """A session as a transfer document: ``GET …/export``, ``POST …/import``."""

    info: Session
    messages: tuple[SessionMessage, ...] = ()


@attrs.frozen(kw_only=True)
class ModelUsage:
    """What the assistant messages of one model spent (``model`` absent: none recorded)."""

    model: ModelRef | None = None
    sessions: int = 0
    messages: int = 0
    cost: float = 0.0
    tokens: Tokens = attrs.field(factory=Tokens)


@attrs.frozen(kw_only=True)
class SessionStats:
    """Session counts, and tokens and cost in total and by model."""

    sessions: int = 0
    forks: int = 0
    cost: float = 0.0
    tokens: Tokens = attrs.field(factory=Tokens)
    models: tuple[ModelUsage, ...] = ()
