"""Session events: the facts the log records.

Each event is a frozen attrs class with a wire ``TYPE`` (no version, e.g.
``session.inbox.enqueued``) and a ``VERSION``; the log stores the versioned
name (``session.inbox.enqueued.1``). Every session event's aggregate is its
``session_id``. :data:`REGISTRY` is the explicit list of what this build can
decode; a stored type missing from it is skipped on read (see
:func:`decode_event`), never a crash.

Names and fields follow ``reference/opencode-v2.md`` §2.2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal

import attrs
import orjson

from protocol import codec
from protocol.shapes import (
    Delivery,
    ForkBoundary,
    InboxItemType,
    Location,
    ModelRef,
    SessionRevert,
    ShellInfo,
)

__all__ = [
    "LIVE_TYPES",
    "REGISTRY",
    "AgentSelected",
    "CompactionDelta",
    "CompactionEnded",
    "CompactionFailed",
    "CompactionReason",
    "CompactionStarted",
    "EnqueuedItem",
    "ErrorInfo",
    "Event",
    "EventEnvelope",
    "ExecutionFailed",
    "ExecutionInterrupted",
    "ExecutionRecovering",
    "ExecutionStarted",
    "ExecutionSucceeded",
    "ImportFinished",
    "ImportStarted",
    "InboxCancelled",
    "InboxDelivered",
    "InboxDeliveryChanged",
    "InboxEnqueued",
    "InstructionsUpdated",
    "InterruptReason",
    "MessageImported",
    "MetadataUpdated",
    "ModelSelected",
    "PermissionAsked",
    "PermissionReplied",
    "PermissionReply",
    "ReasoningDelta",
    "ReasoningEnded",
    "ReasoningStarted",
    "RetryScheduled",
    "RevertCleared",
    "RevertCommitted",
    "RevertStaged",
    "SessionCreated",
    "SessionDeleted",
    "SessionForked",
    "SessionMoved",
    "SessionRenamed",
    "SessionViewed",
    "ShellEnded",
    "ShellSpawned",
    "ShellStarted",
    "StepEnded",
    "StepFailed",
    "StepStarted",
    "StepTokens",
    "SyntheticRecorded",
    "TextDelta",
    "TextEnded",
    "TextStarted",
    "ToolCalled",
    "ToolFailed",
    "ToolInputDelta",
    "ToolInputEnded",
    "ToolInputStarted",
    "ToolProgress",
    "ToolSpawned",
    "ToolSucceeded",
    "UsageRecorded",
    "decode_event",
    "encode_data",
    "envelope",
    "stored_type",
]


@attrs.frozen(kw_only=True)
class Event:
    """Base of every session event; ``session_id`` is the aggregate."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    #: Live-only events are published but never stored.
    DURABLE: ClassVar[bool] = True

    session_id: str

    def envelope_metadata(self) -> Mapping[str, Any] | None:
        """The envelope's ``metadata``, derived from the data; None for most events."""
        return None


@attrs.frozen(kw_only=True)
class SessionCreated(Event):
    TYPE = "session.created"
    parent_id: str | None = None
    title: str
    agent: str | None = None
    model: ModelRef | None = None
    location: Location
    metadata: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ImportStarted(SessionCreated):
    """A session begins as an import written in several commands (a large document).

    Its fields are ``session.created``'s; the session it makes is hidden (not
    read, listed or counted) until its ``session.import.finished``, so other
    writes can go between the import's commands while readers see the import
    whole or not at all. One that never finishes (its process died) is
    deleted by the recovery sweep.
    """

    TYPE = "session.import.started"


@attrs.frozen(kw_only=True)
class ImportFinished(Event):
    """The import's last command: its session is read and listed from here on."""

    TYPE = "session.import.finished"


@attrs.frozen(kw_only=True)
class SessionRenamed(Event):
    TYPE = "session.renamed"
    title: str


@attrs.frozen(kw_only=True)
class MetadataUpdated(Event):
    TYPE = "session.metadata.updated"
    metadata: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class AgentSelected(Event):
    TYPE = "session.agent.selected"
    agent: str
    previous: str | None = None


@attrs.frozen(kw_only=True)
class ModelSelected(Event):
    TYPE = "session.model.selected"
    model: ModelRef
    previous: ModelRef | None = None


@attrs.frozen(kw_only=True)
class SessionDeleted(Event):
    TYPE = "session.deleted"
    VERSION = 2


@attrs.frozen(kw_only=True)
class SessionForked(Event):
    """The session ``session_id`` begins as a fork of ``parent_id``.

    Its first event: the projection creates the session from the parent's row
    and copies the parent's settled transcript through ``boundary`` as it is
    projected at this event's position, so replay copies exactly the same rows.
    ``instructions`` (key -> content hash) is the parent's newest instruction
    state, the fork's baseline; ``instruction_entries`` a copy of its API entries.
    """

    TYPE = "session.forked"
    VERSION = 2
    parent_id: str
    boundary: ForkBoundary
    instructions: Mapping[str, str] | None = None
    instruction_entries: tuple[Mapping[str, Any], ...] | None = None


@attrs.frozen(kw_only=True)
class SessionMoved(Event):
    TYPE = "session.moved"
    location: Location
    project_id: str | None = None
    subpath: str | None = None


@attrs.frozen(kw_only=True)
class SessionViewed(Event):
    """A client saw the session's idle transition ``idle`` (epoch ms watermark)."""

    TYPE = "session.viewed"
    idle: int


@attrs.frozen(kw_only=True)
class MessageImported(Event):
    """A transcript message recorded as it is, from an imported session document.

    ``message`` is the public :class:`~protocol.shapes.SessionMessage` JSON
    without ``sessionID`` and ``seq`` (this event's seq becomes the message's).
    """

    TYPE = "session.message.imported"
    message: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class UsageRecorded(Event):
    """Usage charged to the session outside any step (``import``: a document's totals)."""

    TYPE = "session.usage.recorded"
    source: Literal["title", "compaction", "import"]
    cost: float
    tokens: StepTokens


@attrs.frozen(kw_only=True)
class EnqueuedItem:
    type: InboxItemType
    payload: Mapping[str, Any]
    delivery: Delivery


@attrs.frozen(kw_only=True)
class InboxEnqueued(Event):
    TYPE = "session.inbox.enqueued"
    inbox_id: str
    item: EnqueuedItem


@attrs.frozen(kw_only=True)
class InboxDelivered(Event):
    TYPE = "session.inbox.delivered"
    inbox_id: str


@attrs.frozen(kw_only=True)
class InboxCancelled(Event):
    TYPE = "session.inbox.cancelled"
    inbox_id: str


@attrs.frozen(kw_only=True)
class InboxDeliveryChanged(Event):
    TYPE = "session.inbox.delivery.changed"
    inbox_id: str
    delivery: Delivery


@attrs.frozen(kw_only=True)
class SyntheticRecorded(Event):
    """A synthetic transcript message recorded directly, outside the inbox."""

    TYPE = "session.synthetic"
    message_id: str
    text: str
    description: str | None = None
    metadata: Mapping[str, Any] | None = None


# -- instructions ---------------------------------------------------------------------------------

#: A delta value naming an observed absence instead of a content hash.
REMOVED: Final = "removed"


@attrs.frozen(kw_only=True)
class InstructionsUpdated(Event):
    """Instruction values admitted at a Safe Step Boundary, as content hashes.

    ``delta`` maps each changed source key to the SHA-256 hex of its encoded
    value, or :data:`REMOVED`. The values themselves live once in the
    machine-local blob store, written by the same commit. ``text`` is the
    update rendered once at admission and frozen here; the initial delta of
    an epoch carries none (its envelope says ``metadata.instructions.initial``).
    """

    TYPE = "session.instructions.updated"
    VERSION = 2
    delta: Mapping[str, str]
    text: str | None = None

    def envelope_metadata(self) -> Mapping[str, Any] | None:
        # Every later delta renders a sentence per key (a removal too), so
        # only an epoch's initial delta has no text.
        return {"instructions": {"initial": True}} if self.text is None else None


# -- epoch events owned by other issues (revert): the fields the instruction
# -- projection reads, named as reference §2.2 names them.


# -- user shells and reverts ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ShellStarted(Event):
    TYPE = "session.shell.started"
    shell: ShellInfo


@attrs.frozen(kw_only=True)
class ShellSpawned(Event):
    """A user shell's process group exists and has not yet run the command.

    Durable before the command may do anything (it waits behind a gate), so
    the next start can kill a group a crash left running before it records
    the shell as ``cancelled``. The group is named as in :class:`ToolSpawned`.
    """

    TYPE = "session.shell.spawned"
    shell_id: str
    pgid: int
    start_ticks: int
    boot_id: str


@attrs.frozen(kw_only=True)
class ShellEnded(Event):
    """The command ended (or was cancelled); ``output`` is bounded like tool output."""

    TYPE = "session.shell.ended"
    shell: ShellInfo
    output: str


@attrs.frozen(kw_only=True)
class RevertStaged(Event):
    TYPE = "session.revert.staged"
    revert: SessionRevert


@attrs.frozen(kw_only=True)
class RevertCleared(Event):
    TYPE = "session.revert.cleared"


@attrs.frozen(kw_only=True)
class RevertCommitted(Event):
    """The staged revert is permanent: the transcript from ``to`` on leaves the
    projections (never the log) and instruction state is cleared."""

    TYPE = "session.revert.committed"
    to: str


# -- execution ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ErrorInfo:
    """A session error: ``aborted``, ``provider.transport``, ``tool.error`` …"""

    type: str
    message: str


InterruptReason = Literal["user", "shutdown", "superseded", "inactivity"]


@attrs.frozen(kw_only=True)
class ExecutionStarted(Event):
    """A busy period began here; commits the write-ahead claim with it."""

    TYPE = "session.execution.started"


@attrs.frozen(kw_only=True)
class ExecutionSucceeded(Event):
    TYPE = "session.execution.succeeded"


@attrs.frozen(kw_only=True)
class ExecutionFailed(Event):
    TYPE = "session.execution.failed"
    error: ErrorInfo


@attrs.frozen(kw_only=True)
class ExecutionInterrupted(Event):
    TYPE = "session.execution.interrupted"
    reason: InterruptReason


@attrs.frozen(kw_only=True)
class ExecutionRecovering(Event):
    """Startup recovery is about to resume a claimed execution (attempt n).

    Recorded before the resume, so a crash during recovery still counts the
    attempt and the bound on attempts cannot be dodged by crash-looping.
    """

    TYPE = "session.execution.recovering"
    attempt: int


# -- steps ----------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StepTokens:
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0


@attrs.frozen(kw_only=True)
class StepStarted(Event):
    TYPE = "session.step.started"
    assistant_message_id: str
    agent: str
    model: ModelRef
    #: Dispatch time of the step's first attempt, epoch ms (the event itself
    #: is written at the step's first output: no output, no record).
    started: int
    #: The file snapshot before the step, in logs written before snapshots
    #: became lazy (now on ``step.ended``/``step.failed`` as ``before``).
    snapshot: str | None = None


@attrs.frozen(kw_only=True)
class StepEnded(Event):
    TYPE = "session.step.ended"
    assistant_message_id: str
    finish: str
    cost: float = 0.0
    tokens: StepTokens = attrs.field(factory=StepTokens)
    #: Provider-native continuation state (e.g. reasoning signatures), replayed
    #: only to the exact provider and model that produced it.
    provider_state: Mapping[str, Any] | None = None
    #: The file snapshots of a step that ran a writing tool (tree ids of the
    #: project's snapshot store): ``before`` holds each path it changed as it
    #: was before the step first touched it, ``snapshot`` the tree after it;
    #: ``files`` the paths it changed, relative to the Location.
    before: str | None = None
    snapshot: str | None = None
    files: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class StepFailed(Event):
    TYPE = "session.step.failed"
    assistant_message_id: str
    error: ErrorInfo
    finish: str | None = None
    cost: float | None = None
    tokens: StepTokens | None = None
    provider_state: Mapping[str, Any] | None = None
    #: As on ``step.ended``: what the failed step's writing calls changed.
    before: str | None = None
    snapshot: str | None = None
    files: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class RetryScheduled(Event):
    """A failed physical attempt will be retried at ``at`` (epoch ms), same message.

    ``attempt`` numbers the retry from 1. Published before the runner sleeps,
    so a crash during the backoff leaves it in the log.
    """

    TYPE = "session.retry.scheduled"
    assistant_message_id: str
    attempt: int
    at: int
    error: ErrorInfo


@attrs.frozen(kw_only=True)
class TextStarted(Event):
    TYPE = "session.text.started"
    assistant_message_id: str
    ordinal: int


@attrs.frozen(kw_only=True)
class TextEnded(Event):
    TYPE = "session.text.ended"
    assistant_message_id: str
    ordinal: int
    text: str


@attrs.frozen(kw_only=True)
class ReasoningStarted(Event):
    TYPE = "session.reasoning.started"
    assistant_message_id: str
    ordinal: int


@attrs.frozen(kw_only=True)
class ReasoningEnded(Event):
    TYPE = "session.reasoning.ended"
    assistant_message_id: str
    ordinal: int
    text: str


@attrs.frozen(kw_only=True)
class ToolInputStarted(Event):
    TYPE = "session.tool.input.started"
    assistant_message_id: str
    id: str
    name: str


@attrs.frozen(kw_only=True)
class ToolInputEnded(Event):
    TYPE = "session.tool.input.ended"
    assistant_message_id: str
    id: str
    text: str


@attrs.frozen(kw_only=True)
class ToolCalled(Event):
    """Durable before the tool's side effects begin."""

    TYPE = "session.tool.called"
    assistant_message_id: str
    id: str
    name: str
    input: Mapping[str, Any]
    executed: bool = True
    #: True for a hosted call: the provider runs it, no local tool ever does.
    provider_executed: bool | None = None


@attrs.frozen(kw_only=True)
class ToolSpawned(Event):
    """A tool call's process group exists and has not yet run the command.

    Durable before the command may do anything: the tool holds the command
    behind a gate until this commits. The next start finds the group here
    (until the call's terminal) and kills it before failing the call as stale.
    ``start_ticks`` is the leader's start time (``/proc/<pid>/stat`` field 22,
    clock ticks since boot) and ``boot_id`` the kernel's boot id: together
    with ``pgid`` they name one process group, never a later one that reuses
    the number.
    """

    TYPE = "session.tool.spawned"
    assistant_message_id: str
    id: str
    pgid: int
    start_ticks: int
    boot_id: str


@attrs.frozen(kw_only=True)
class ToolSucceeded(Event):
    TYPE = "session.tool.success"
    VERSION = 2
    assistant_message_id: str
    id: str
    content: tuple[Mapping[str, Any], ...]
    metadata: Mapping[str, Any] | None = None
    executed: bool = True


@attrs.frozen(kw_only=True)
class ToolFailed(Event):
    TYPE = "session.tool.failed"
    VERSION = 2
    assistant_message_id: str
    id: str
    error: ErrorInfo
    content: tuple[Mapping[str, Any], ...] | None = None
    metadata: Mapping[str, Any] | None = None
    executed: bool = True


# -- compaction -----------------------------------------------------------------------------------

CompactionReason = Literal["auto", "manual"]


@attrs.frozen(kw_only=True)
class CompactionStarted(Event):
    """A compaction began: ``recent`` is the serialized tail kept (``""`` for a
    manual one at delivery, published with the control item's delivery)."""

    TYPE = "session.compaction.started"
    reason: CompactionReason
    recent: str
    input_id: str | None = None


@attrs.frozen(kw_only=True)
class CompactionEnded(Event):
    """The summary is durable: the active history restarts from ``text`` + ``recent``.

    Also the instruction epoch's boundary (current instruction values become initial).
    """

    TYPE = "session.compaction.ended"
    reason: CompactionReason
    model: ModelRef
    provider_state: Mapping[str, Any] | None = None
    provider_context: Mapping[str, Any] | None = None
    text: str
    recent: str
    cost: float = 0.0
    tokens: StepTokens = attrs.field(factory=StepTokens)


@attrs.frozen(kw_only=True)
class CompactionFailed(Event):
    TYPE = "session.compaction.failed"
    reason: CompactionReason
    error: ErrorInfo
    input_id: str | None = None
    cost: float | None = None
    tokens: StepTokens | None = None


PermissionReply = Literal["once", "always", "reject"]


@attrs.frozen(kw_only=True)
class PermissionAsked(Event):
    """A tool call waits for a person's answer before it may run.

    Durable after the call's ``tool.called`` and before anything runs.
    ``permission`` is the rule key that said ``ask`` (the tool's name, or
    ``external_directory``); ``patterns`` are the subjects it judged (bash
    simple commands, paths), ``always`` the patterns an ``always`` reply
    allows for the rest of the session, ``summary`` a short, bounded text of
    the call's input for a person to read.
    """

    TYPE = "session.permission.asked"
    id: str
    tool: str
    call_id: str
    assistant_message_id: str
    permission: str
    summary: str
    patterns: tuple[str, ...]
    always: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class PermissionReplied(Event):
    """The answer to one :class:`PermissionAsked`; ``always`` also records a session rule."""

    TYPE = "session.permission.replied"
    id: str
    reply: PermissionReply


# -- live only: published to followers of the instance feed, never stored ------------------------


@attrs.frozen(kw_only=True)
class TextDelta(Event):
    TYPE = "session.text.delta"
    DURABLE = False
    assistant_message_id: str
    ordinal: int
    delta: str


@attrs.frozen(kw_only=True)
class ReasoningDelta(Event):
    TYPE = "session.reasoning.delta"
    DURABLE = False
    assistant_message_id: str
    ordinal: int
    delta: str


@attrs.frozen(kw_only=True)
class ToolInputDelta(Event):
    TYPE = "session.tool.input.delta"
    DURABLE = False
    assistant_message_id: str
    id: str
    delta: str


@attrs.frozen(kw_only=True)
class ToolProgress(Event):
    TYPE = "session.tool.progress"
    DURABLE = False
    assistant_message_id: str
    id: str
    metadata: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class CompactionDelta(Event):
    """A piece of a compaction's summary as it streams (instance feed only)."""

    TYPE = "session.compaction.delta"
    DURABLE = False
    text: str


def stored_type(event: Event | type[Event]) -> str:
    """The versioned type the log stores: ``session.inbox.enqueued.1``."""
    return f"{event.TYPE}.{event.VERSION}"


REGISTRY: Mapping[str, type[Event]] = {
    stored_type(cls): cls
    for cls in (
        SessionCreated,
        SessionRenamed,
        MetadataUpdated,
        AgentSelected,
        ModelSelected,
        SessionDeleted,
        SessionForked,
        SessionViewed,
        MessageImported,
        ImportStarted,
        ImportFinished,
        UsageRecorded,
        InboxEnqueued,
        InboxDelivered,
        InboxCancelled,
        InboxDeliveryChanged,
        SyntheticRecorded,
        ShellStarted,
        ShellSpawned,
        ShellEnded,
        RevertStaged,
        RevertCleared,
        RevertCommitted,
        InstructionsUpdated,
        SessionForked,
        SessionMoved,
        ExecutionStarted,
        ExecutionSucceeded,
        ExecutionFailed,
        ExecutionInterrupted,
        ExecutionRecovering,
        StepStarted,
        StepEnded,
        StepFailed,
        RetryScheduled,
        TextStarted,
        TextEnded,
        ReasoningStarted,
        ReasoningEnded,
        ToolInputStarted,
        ToolInputEnded,
        ToolCalled,
        ToolSpawned,
        ToolSucceeded,
        ToolFailed,
        CompactionStarted,
        CompactionEnded,
        CompactionFailed,
        PermissionAsked,
        PermissionReplied,
    )
}

#: Live-only event types: never stored, so never in :data:`REGISTRY`.
LIVE_TYPES: Mapping[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (TextDelta, ReasoningDelta, ToolInputDelta, ToolProgress, CompactionDelta)
}


def encode_data(event: Event) -> bytes:
    """The stored/wire ``data`` member of an event, as JSON bytes."""
    return codec.dumps(event)


def decode_event(type_: str, data: bytes | str) -> Event | None:
    """Decode stored data; None when this build does not know ``type_``."""
    cls = REGISTRY.get(type_)
    if cls is None:
        return None
    return codec.from_json(cls, orjson.loads(data))


#: The public event envelope of ``reference/wire.md`` as JSON-ready values: what
#: the instance feed publishes and the SSE layer sends.
EventEnvelope = dict[str, Any]


def envelope(*, id: str, created: int, event: Event, seq: int | None) -> EventEnvelope:
    """The public event envelope of ``reference/wire.md``."""
    out: dict[str, Any] = {"id": id, "created": created, "type": event.TYPE}
    metadata = event.envelope_metadata()
    if metadata is not None:
        out["metadata"] = metadata
    if seq is not None:
        out["durable"] = {"aggregateID": event.session_id, "seq": seq, "version": event.VERSION}
    out["data"] = codec.to_json(event)
    return out
