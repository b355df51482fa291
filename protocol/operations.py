"""The operation table: every public operation, declared once.

Each :class:`Operation` names its method, path, inputs (path parameters,
query, body), output and declared errors. The server derives its routes and
request validation from it, ``GET /doc`` derives the OpenAPI document from it
(:mod:`protocol.openapi`), and the Python client derives its calls from it
(:mod:`protocol.client`). Nothing here knows about aiohttp.

Outputs:

- ``data``: ``{"data": <output>}``;
- ``page``: ``{"data": [<output>...], "cursor": {"previous"?, "next"?}}``;
- ``items``: ``{"data": [<output>...]}``;
- ``no_content``: 204, no body;
- ``raw``: the output as it is (``session.interrupt`` answers ``{interrupted}``);
- ``text``: a ``text/plain`` body, a ``str`` to the client (``server.metrics``
  answers the Prometheus text exposition format, which has no JSON form);
- ``sse``: a ``text/event-stream``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from protocol import errors as e
from protocol import ids
from protocol.events import PermissionAsked, PermissionReply
from protocol.ids import IdKind
from protocol.requests import (
    CompactInput,
    CreateSessionInput,
    ForkInput,
    GenerateInput,
    MoveInput,
    PromptInput,
    SyntheticInput,
    UpdateSessionInput,
    ViewInput,
)
from protocol.shapes import (
    Delivery,
    FileDiff,
    InboxItem,
    InstructionEntry,
    ModelRef,
    Order,
    Session,
    SessionExport,
    SessionMessage,
    SessionRevert,
    SessionStats,
)

__all__ = [
    "OPERATIONS",
    "ActiveSession",
    "AgentInfo",
    "AgentInput",
    "DeliveryInput",
    "DiffQuery",
    "EnvironmentInput",
    "ExportQuery",
    "GenerateResult",
    "HealthStatus",
    "InstructionEntryInput",
    "InterruptQuery",
    "InterruptResult",
    "LogQuery",
    "McpLocationStatus",
    "McpServerStatus",
    "MessagesQuery",
    "ModelInfo",
    "ModelInput",
    "Operation",
    "OutputKind",
    "PermissionReplyInput",
    "RevertStageInput",
    "SessionListQuery",
    "ShellInput",
    "by_id",
]

OutputKind = Literal["data", "page", "items", "no_content", "raw", "text", "sse"]
Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]


# -- inputs only the table uses ---------------------------------------------------------------


#: Page sizes the session facade accepts (``actors.sessions.MAX_PAGE``).
_LIMIT: Final = attrs.field(
    default=None, metadata={"schema": {"type": "integer", "minimum": 1, "maximum": 200}}
)
#: A continuation cursor: opaque, never empty (an empty one is an InvalidCursorError).
_CURSOR: Final = attrs.field(default=None, metadata={"schema": {"type": "string", "minLength": 1}})


@attrs.frozen(kw_only=True)
class SessionListQuery:
    limit: int | None = _LIMIT
    order: Order | None = None
    search: str | None = None
    #: A session id, or the literal ``null`` for root sessions only.
    parent_id: str | None = attrs.field(
        default=None,
        metadata={"schema": {"type": "string", "pattern": f"^null$|{ids.pattern('ses')}"}},
    )
    cursor: str | None = _CURSOR


@attrs.frozen(kw_only=True)
class MessagesQuery:
    limit: int | None = _LIMIT
    order: Order | None = None
    cursor: str | None = _CURSOR


@attrs.frozen(kw_only=True)
class InterruptQuery:
    resume: bool = False


@attrs.frozen(kw_only=True)
class LogQuery:
    after: int = 0
    follow: bool = False


@attrs.frozen(kw_only=True)
class ExportQuery:
    #: Leave out file contents and tool outputs.
    sanitize: bool = False


@attrs.frozen(kw_only=True)
class GenerateResult:
    text: str


@attrs.frozen(kw_only=True)
class AgentInput:
    agent: str = attrs.field(metadata={"schema": {"type": "string", "minLength": 1}})


@attrs.frozen(kw_only=True)
class ModelInput:
    model: ModelRef


@attrs.frozen(kw_only=True)
class DeliveryInput:
    delivery: Delivery


_MSG_ID: Final = {"type": "string", "pattern": r"^msg_[0-9A-Za-z_-]{1,100}$"}


@attrs.frozen(kw_only=True)
class ShellInput:
    #: The shell entry's id (a message id); a retry with the same id starts nothing.
    id: str | None = attrs.field(default=None, metadata={"schema": _MSG_ID})
    command: str = attrs.field(metadata={"schema": {"type": "string", "pattern": "\\S"}})


@attrs.frozen(kw_only=True)
class EnvironmentInput:
    variables: Mapping[str, str]


@attrs.frozen(kw_only=True)
class RevertStageInput:
    message_id: str = attrs.field(metadata={"schema": _MSG_ID})
    #: Also restore the files the later steps changed.
    files: bool = False


@attrs.frozen(kw_only=True)
class DiffQuery:
    #: User message ids: the snapshots before each; ``to`` left out is now.
    from_: str | None = attrs.field(
        default=None,
        metadata={"wire": "from", "schema": {"type": "string", "pattern": ids.pattern("msg")}},
    )
    to: str | None = attrs.field(
        default=None, metadata={"schema": {"type": "string", "pattern": ids.pattern("msg")}}
    )
    context: int | None = attrs.field(
        default=None, metadata={"schema": {"type": "integer", "minimum": 0}}
    )
    #: An assistant message id (a step): the files that step changed, from its
    #: own snapshots. Not with ``from``/``to``.
    message_id: str | None = attrs.field(
        default=None,
        metadata={
            "wire": "messageID",
            "schema": {"type": "string", "pattern": ids.pattern("msg")},
        },
    )


@attrs.frozen(kw_only=True)
class PermissionReplyInput:
    reply: PermissionReply


@attrs.frozen(kw_only=True)
class InstructionEntryInput:
    #: Any JSON value, at most 256 KiB serialised.
    value: Any


@attrs.frozen(kw_only=True)
class InterruptResult:
    interrupted: bool


@attrs.frozen(kw_only=True)
class HealthStatus:
    #: Always true in a 200; a store that takes no writes answers a tagged 503.
    healthy: bool


@attrs.frozen(kw_only=True)
class McpLocationStatus:
    #: A Location whose server process (or HTTP session) this is.
    directory: str
    status: Literal["idle", "starting", "connected", "failed"]
    error: str | None = None


@attrs.frozen(kw_only=True)
class McpServerStatus:
    """A configured MCP server (``[mcp.<name>]``): one connection per Location using it."""

    name: str
    transport: Literal["stdio", "http"]
    #: ``connected`` when some Location's connection is; ``failed`` (with
    #: ``error``) when none is and one failed; ``idle`` before first use.
    status: Literal["idle", "starting", "connected", "failed", "disabled"]
    error: str | None = None
    #: Its tools as the model sees them: ``<server>_<tool>``.
    tools: tuple[str, ...] = ()
    locations: tuple[McpLocationStatus, ...] = ()


@attrs.frozen(kw_only=True)
class AgentInfo:
    """An agent a session may select (its system prompt, script and permissions not shown)."""

    name: str
    #: ``primary`` (a session's agent), ``subagent`` (only through the
    #: ``task`` tool) or ``all`` (either).
    mode: Literal["primary", "subagent", "all"]
    description: str = ""
    #: The model it runs on; None: the session's selected model.
    model: ModelRef | None = None


@attrs.frozen(kw_only=True)
class ModelInfo:
    """A model this server can be asked for: a configured provider's model, or scripted."""

    provider_id: str
    id: str


@attrs.frozen(kw_only=True)
class ActiveSession:
    type: Literal["running"] = "running"
    #: The host whose lease runs it (several hosts may share one database).
    host: str | None = None
    #: That lease's fencing epoch.
    epoch: int | None = None


# -- the table --------------------------------------------------------------------------------

_PARAM: Final = re.compile(r"{(\w+)}")
_ID_KINDS: Final[dict[str, IdKind]] = {
    "sessionID": "ses",
    "inboxID": "msg",
    "messageID": "msg",
    "shellID": "msg",
    "permissionID": "per",
}
#: Path parameters that are not ids, by the pattern they must match.
PARAM_PATTERNS: Final[dict[str, str]] = {"key": r"^[a-z0-9][a-z0-9._-]*$"}

#: Every route can fail these: a malformed request, or missing credentials.
COMMON_ERRORS: Final[tuple[type[e.DomainError], ...]] = (e.InvalidRequestError, e.UnauthorizedError)


@attrs.frozen(kw_only=True)
class Operation:
    id: str
    method: Method
    path: str
    summary: str
    output_kind: OutputKind
    output: Any = None
    query: type[Any] | None = None
    body: type[Any] | None = None
    errors: tuple[type[e.DomainError], ...] = ()
    #: (client group, method name), e.g. ("sessions", "prompt").
    client: tuple[str, str]
    #: Its body may be tens of MiB (an import): the server parses it off the
    #: event loop in pieces and hands the handler the JSON value to decode.
    large_body: bool = False

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.path))

    def id_kind(self, param: str) -> IdKind | None:
        """The id kind of ``param``; None for a parameter that is no id (see :meth:`pattern`)."""
        return _ID_KINDS.get(param)

    def pattern(self, param: str) -> str:
        """The JSON Schema ``pattern`` a value of path parameter ``param`` matches."""
        kind = _ID_KINDS.get(param)
        return ids.pattern(kind) if kind is not None else PARAM_PATTERNS[param]

    @property
    def streaming(self) -> bool:
        return self.output_kind == "sse"

    @property
    def all_errors(self) -> tuple[type[e.DomainError], ...]:
        seen: dict[str, type[e.DomainError]] = {}
        for cls in (*COMMON_ERRORS, *self.errors):
            seen.setdefault(cls.tag, cls)
        return tuple(seen.values())

    def url(self, **params: str) -> str:
        return _PARAM.sub(lambda m: params[m.group(1)], self.path)


_NF = (e.SessionNotFoundError,)

OPERATIONS: Final[tuple[Operation, ...]] = (
    Operation(
        id="session.list",
        method="GET",
        path="/api/session",
        summary="List sessions, newest first by default, in cursor pages",
        query=SessionListQuery,
        output_kind="page",
        output=Session,
        errors=(e.InvalidCursorError,),
        client=("sessions", "list"),
    ),
    Operation(
        id="session.create",
        method="POST",
        path="/api/session",
        summary="Create a session; reusing an id adopts the existing session",
        body=CreateSessionInput,
        output_kind="data",
        output=Session,
        errors=(*_NF, e.ConflictError),
        client=("sessions", "create"),
    ),
    Operation(
        id="session.active",
        method="GET",
        path="/api/session/active",
        summary="Sessions with an execution running in this process",
        output_kind="data",
        output=Mapping[str, ActiveSession],
        client=("sessions", "active"),
    ),
    Operation(
        id="session.get",
        method="GET",
        path="/api/session/{sessionID}",
        summary="Get a session",
        output_kind="data",
        output=Session,
        errors=_NF,
        client=("sessions", "get"),
    ),
    Operation(
        id="session.update",
        method="PATCH",
        path="/api/session/{sessionID}",
        summary="Rename a session or replace its metadata",
        body=UpdateSessionInput,
        output_kind="no_content",
        errors=_NF,
        client=("sessions", "update"),
    ),
    Operation(
        id="session.remove",
        method="DELETE",
        path="/api/session/{sessionID}",
        summary="Delete a session and its descendants",
        output_kind="no_content",
        errors=_NF,
        client=("sessions", "remove"),
    ),
    Operation(
        id="session.children",
        method="GET",
        path="/api/session/{sessionID}/children",
        summary="The session's child sessions (subagents, forks), oldest first",
        output_kind="items",
        output=Session,
        errors=_NF,
        client=("sessions", "children"),
    ),
    Operation(
        id="session.fork",
        method="POST",
        path="/api/session/{sessionID}/fork",
        summary="Fork the session: a new session with its settled transcript through a boundary",
        body=ForkInput,
        output_kind="data",
        output=Session,
        errors=(*_NF, e.MessageNotFoundError),
        client=("sessions", "fork"),
    ),
    Operation(
        id="session.view",
        method="POST",
        path="/api/session/{sessionID}/view",
        summary="Mark the session's idle transition (time.idle) as viewed",
        body=ViewInput,
        output_kind="no_content",
        errors=_NF,
        client=("sessions", "view"),
    ),
    Operation(
        id="session.generate",
        method="POST",
        path="/api/session/{sessionID}/generate",
        summary="A one-off answer from the session's context and model; records nothing",
        body=GenerateInput,
        output_kind="data",
        output=GenerateResult,
        errors=(*_NF, e.ServiceUnavailableError),
        client=("sessions", "generate"),
    ),
    Operation(
        id="session.export",
        method="GET",
        path="/api/experimental/session/{sessionID}/export",
        summary="The session and its transcript as a transfer document {info, messages}",
        query=ExportQuery,
        output_kind="raw",
        output=SessionExport,
        errors=_NF,
        client=("sessions", "export"),
    ),
    Operation(
        id="session.importSession",
        method="POST",
        path="/api/experimental/session/import",
        summary="Create a session from a transfer document, checked as a create is (its"
        " metadata.script dropped unless the operator allows it); an id already used is a 409",
        body=SessionExport,
        output_kind="data",
        output=Session,
        errors=(e.ConflictError,),
        client=("sessions", "import_session"),
        large_body=True,
    ),
    Operation(
        id="session.stats",
        method="GET",
        path="/api/experimental/session/stats",
        summary="Session counts, and tokens and cost by model",
        output_kind="data",
        output=SessionStats,
        client=("sessions", "stats"),
    ),
    Operation(
        id="session.prompt",
        method="POST",
        path="/api/session/{sessionID}/prompt",
        summary="Admit a user prompt durably; the receipt returns before anything runs",
        body=PromptInput,
        output_kind="data",
        output=InboxItem,
        errors=(*_NF, e.ConflictError),
        client=("sessions", "prompt"),
    ),
    Operation(
        id="session.synthetic",
        method="POST",
        path="/api/session/{sessionID}/synthetic",
        summary="Admit synthetic input durably",
        body=SyntheticInput,
        output_kind="data",
        output=InboxItem,
        errors=(*_NF, e.ConflictError),
        client=("sessions", "synthetic"),
    ),
    Operation(
        id="session.compact",
        method="POST",
        path="/api/session/{sessionID}/compact",
        summary="Request a manual compaction: a control item in the inbox, one pending at most",
        body=CompactInput,
        output_kind="data",
        output=InboxItem,
        errors=(*_NF, e.ConflictError),
        client=("sessions", "compact"),
    ),
    Operation(
        id="session.move",
        method="POST",
        path="/api/session/{sessionID}/move",
        summary="Move the session to another directory: a control item delivered at a"
        " step boundary; a missing directory is a 400, another move pending a 409",
        body=MoveInput,
        output_kind="no_content",
        errors=(*_NF, e.ConflictError),
        client=("sessions", "move"),
    ),
    Operation(
        id="session.interrupt",
        method="POST",
        path="/api/session/{sessionID}/interrupt",
        summary="Interrupt the session's execution, on whichever host runs it; pending input stays",
        query=InterruptQuery,
        output_kind="raw",
        output=InterruptResult,
        errors=(*_NF, e.ServiceUnavailableError),
        client=("sessions", "interrupt"),
    ),
    Operation(
        id="session.resume",
        method="POST",
        path="/api/session/{sessionID}/resume",
        summary="Start or join the session's execution; answers when it settles",
        output_kind="no_content",
        errors=(*_NF, e.ServiceUnavailableError),
        client=("sessions", "resume"),
    ),
    Operation(
        id="session.wait",
        method="POST",
        path="/api/experimental/session/{sessionID}/wait",
        summary="Answer once the session is idle; never starts work",
        output_kind="no_content",
        errors=(*_NF, e.ServiceUnavailableError),
        client=("sessions", "wait"),
    ),
    Operation(
        id="session.agents",
        method="GET",
        path="/api/session/{sessionID}/agent",
        summary="The agents the session may select: built in, the operator's and its"
        " directory's, by name",
        output_kind="items",
        output=AgentInfo,
        errors=_NF,
        client=("sessions", "agents"),
    ),
    Operation(
        id="session.switchAgent",
        method="POST",
        path="/api/session/{sessionID}/agent",
        summary="Select the agent for later steps",
        body=AgentInput,
        output_kind="no_content",
        errors=_NF,
        client=("sessions", "switch_agent"),
    ),
    Operation(
        id="session.switchModel",
        method="POST",
        path="/api/session/{sessionID}/model",
        summary="Select the model for later steps",
        body=ModelInput,
        output_kind="no_content",
        errors=_NF,
        client=("sessions", "switch_model"),
    ),
    Operation(
        id="session.inbox.list",
        method="GET",
        path="/api/session/{sessionID}/inbox",
        summary="Pending input in enqueue order",
        output_kind="items",
        output=InboxItem,
        errors=_NF,
        client=("sessions", "inbox"),
    ),
    Operation(
        id="session.inbox.cancel",
        method="DELETE",
        path="/api/session/{sessionID}/inbox/{inboxID}",
        summary="Cancel a pending input; its id may be admitted again",
        output_kind="no_content",
        errors=(*_NF, e.ConflictError),
        client=("sessions", "cancel"),
    ),
    Operation(
        id="session.inbox.update",
        method="PATCH",
        path="/api/session/{sessionID}/inbox/{inboxID}",
        summary="Move a pending input between steer and queue; steering wakes",
        body=DeliveryInput,
        output_kind="no_content",
        errors=(*_NF, e.ConflictError),
        client=("sessions", "change_delivery"),
    ),
    Operation(
        id="session.permission.list",
        method="GET",
        path="/api/session/{sessionID}/permission",
        summary="Tool calls waiting for a permission reply, oldest first",
        output_kind="items",
        output=PermissionAsked,
        errors=_NF,
        client=("sessions", "permissions"),
    ),
    Operation(
        id="session.permission.reply",
        method="POST",
        path="/api/session/{sessionID}/permission/{permissionID}",
        summary="Answer a permission request: once, always (for this session) or reject",
        body=PermissionReplyInput,
        output_kind="no_content",
        errors=(*_NF, e.PermissionNotFoundError, e.ConflictError),
        client=("sessions", "reply_permission"),
    ),
    Operation(
        id="session.messages",
        method="GET",
        path="/api/session/{sessionID}/message",
        summary="The transcript in cursor pages",
        query=MessagesQuery,
        output_kind="page",
        output=SessionMessage,
        errors=(*_NF, e.InvalidCursorError),
        client=("sessions", "messages"),
    ),
    Operation(
        id="session.message.get",
        method="GET",
        path="/api/session/{sessionID}/message/{messageID}",
        summary="One transcript message",
        output_kind="data",
        output=SessionMessage,
        errors=(*_NF, e.MessageNotFoundError),
        client=("sessions", "message"),
    ),
    Operation(
        id="session.context",
        method="GET",
        path="/api/session/{sessionID}/context",
        summary="The model-visible history: the last completed compaction and what follows",
        output_kind="items",
        output=SessionMessage,
        errors=_NF,
        client=("sessions", "context"),
    ),
    Operation(
        id="session.shell",
        method="POST",
        path="/api/session/{sessionID}/shell",
        summary="Run a user shell command now, in the background; its end is a notice",
        body=ShellInput,
        output_kind="no_content",
        errors=(*_NF, e.ConflictError),
        client=("sessions", "shell"),
    ),
    Operation(
        id="session.shell.cancel",
        method="DELETE",
        path="/api/session/{sessionID}/shell/{shellID}",
        summary="End a running user shell command (its process group is killed); its entry"
        " records it as cancelled. An ended one stays as it ended",
        output_kind="no_content",
        errors=(*_NF, e.MessageNotFoundError),
        client=("sessions", "shell_cancel"),
    ),
    Operation(
        id="session.environment",
        method="PUT",
        path="/api/session/{sessionID}/environment",
        summary="Replace the variables the session's shell commands and bash tool get",
        body=EnvironmentInput,
        output_kind="no_content",
        errors=_NF,
        client=("sessions", "environment"),
    ),
    Operation(
        id="session.revert.stage",
        method="POST",
        path="/api/session/{sessionID}/revert/stage",
        summary="Hide the transcript from a message on and, with files, restore its files",
        body=RevertStageInput,
        output_kind="data",
        output=SessionRevert,
        errors=(*_NF, e.MessageNotFoundError, e.SessionBusyError, e.UnknownError),
        client=("sessions", "revert_stage"),
    ),
    Operation(
        id="session.revert.clear",
        method="DELETE",
        path="/api/session/{sessionID}/revert",
        summary="Undo a staged revert: the transcript and the files come back",
        output_kind="no_content",
        errors=(*_NF, e.SessionBusyError, e.UnknownError),
        client=("sessions", "revert_clear"),
    ),
    Operation(
        id="session.revert.commit",
        method="POST",
        path="/api/session/{sessionID}/revert/commit",
        summary="Make a staged revert permanent",
        output_kind="no_content",
        errors=(*_NF, e.SessionBusyError),
        client=("sessions", "revert_commit"),
    ),
    Operation(
        id="session.diff",
        method="GET",
        path="/api/session/{sessionID}/diff",
        summary="File diffs between the snapshots before two user messages, or of one step"
        " (messageID: an assistant message)",
        query=DiffQuery,
        output_kind="items",
        output=FileDiff,
        errors=(*_NF, e.MessageNotFoundError, e.ConflictError, e.UnknownError),
        client=("sessions", "diff"),
    ),
    Operation(
        id="session.log",
        method="GET",
        path="/api/experimental/session/{sessionID}/log",
        summary="Durable session events after a seq, then (follow) live ones",
        query=LogQuery,
        output_kind="sse",
        errors=_NF,
        client=("sessions", "log"),
    ),
    Operation(
        id="session.instructions.entry.list",
        method="GET",
        path="/api/experimental/session/{sessionID}/instructions/entries",
        summary="The session's API-managed instruction entries (removed ones left out)",
        output_kind="items",
        output=InstructionEntry,
        errors=_NF,
        client=("instructions", "list"),
    ),
    Operation(
        id="session.instructions.entry.put",
        method="PUT",
        path="/api/experimental/session/{sessionID}/instructions/entries/{key}",
        summary="Set an instruction entry (upsert); the change is announced at the next step",
        body=InstructionEntryInput,
        output_kind="no_content",
        errors=(*_NF, e.InstructionEntryValueTooLargeError, e.InstructionEntriesFullError),
        client=("instructions", "put"),
    ),
    Operation(
        id="session.instructions.entry.remove",
        method="DELETE",
        path="/api/experimental/session/{sessionID}/instructions/entries/{key}",
        summary="Remove an instruction entry; the removal is announced at the next step",
        output_kind="no_content",
        errors=_NF,
        client=("instructions", "remove"),
    ),
    Operation(
        id="event.subscribe",
        method="GET",
        path="/api/event",
        summary="Every public event of this instance, live; no replay",
        output_kind="sse",
        client=("events", "subscribe"),
    ),
    Operation(
        id="server.health",
        method="GET",
        path="/health",
        summary="Whether the store takes writes: a probe write, at most one at a time",
        output_kind="raw",
        output=HealthStatus,
        errors=(e.ServiceUnavailableError, e.StorageUnavailableError),
        client=("server", "health"),
    ),
    Operation(
        id="server.models",
        method="GET",
        path="/api/model",
        summary="The models the configured providers name (and the scripted one); a"
        " provider configured without a model list takes any model id",
        output_kind="items",
        output=ModelInfo,
        client=("server", "models"),
    ),
    Operation(
        id="server.mcp",
        method="GET",
        path="/api/mcp",
        summary="The configured MCP servers: status (connected, failed with error, disabled)"
        " and tool names",
        output_kind="items",
        output=McpServerStatus,
        client=("server", "mcp"),
    ),
    Operation(
        id="server.metrics",
        method="GET",
        path="/metrics",
        summary="The server's metrics in the Prometheus text exposition format (version 0.0.4)",
        output_kind="text",
        output=str,
        client=("server", "metrics"),
    ),
)


def by_id(op_id: str) -> Operation:
    for op in OPERATIONS:
        if op.id == op_id:
            return op
    raise KeyError(op_id)
