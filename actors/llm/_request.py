"""The normalized request: what the drain asks of a model for one step.

A request is provider-neutral. Adapters translate it to their wire format;
the scripted provider reads it directly. History is a tuple of
:class:`ChatMessage` values whose parts are limited by role:

    ======== ==================================================
    role      parts allowed
    ======== ==================================================
    system    TextContent
    user      TextContent, FileContent
    assistant TextContent, ReasoningContent, ToolCallContent, HostedContent
    tool      ToolResultContent
    ======== ==================================================

A message breaking that table is a bug in whoever built it, so construction
raises :class:`ValueError` at once rather than letting an adapter guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from protocol.shapes import ModelRef

__all__ = [
    "TOOL_RESULT_MAX_CHARS",
    "ChatMessage",
    "ContentPart",
    "FileContent",
    "HostedContent",
    "ModelRequest",
    "ReasoningContent",
    "Role",
    "TextContent",
    "ToolCallContent",
    "ToolChoice",
    "ToolResultContent",
    "ToolSpec",
    "bounded_result",
]

#: The most of one tool result sent to a model. The runtime already bounds
#: tool output (OutputBounding); this guards the request against anything
#: larger that reached history another way.
TOOL_RESULT_MAX_CHARS: Final = 200_000

Role = Literal["system", "user", "assistant", "tool"]
ToolChoice = Literal["auto", "none"]


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool the model may call: its name, what it does, its JSON Schema input."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class TextContent:
    text: str


@attrs.frozen(kw_only=True)
class ReasoningContent:
    """Earlier reasoning; ``signature`` is the provider's proof for replaying it."""

    text: str
    signature: str | None = None


@attrs.frozen(kw_only=True)
class ToolCallContent:
    """A call the assistant made earlier in the history."""

    id: str
    name: str
    input: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class ToolResultContent:
    """The outcome of the call with the same ``id``, as text for the model."""

    id: str
    name: str
    output: str
    is_error: bool = False


@attrs.frozen(kw_only=True)
class HostedContent:
    """A call the provider executed itself, with its result if one arrived.

    ``result`` is the provider's own result block, for native replay (same
    provider and model only, see ``ChatMessage.model``); ``text`` is the
    call and its outcome as plain text, for every other request.
    """

    id: str
    name: str
    input: Mapping[str, Any]
    result: Mapping[str, Any] | None
    text: str


@attrs.frozen(kw_only=True)
class FileContent:
    """A file attached to a user message, base64 in ``data``."""

    mime: str
    data: str
    name: str | None = None


ContentPart = (
    TextContent
    | ReasoningContent
    | ToolCallContent
    | HostedContent
    | ToolResultContent
    | FileContent
)

_ALLOWED: Final[Mapping[Role, tuple[type[Any], ...]]] = {
    "system": (TextContent,),
    "user": (TextContent, FileContent),
    "assistant": (TextContent, ReasoningContent, ToolCallContent, HostedContent),
    "tool": (ToolResultContent,),
}


def _check_parts(instance: ChatMessage, _attribute: Any, parts: tuple[ContentPart, ...]) -> None:
    allowed = _ALLOWED[instance.role]
    for part in parts:
        if not isinstance(part, allowed):
            raise ValueError(f"a {instance.role} message cannot hold {type(part).__name__}")


@attrs.frozen(kw_only=True)
class ChatMessage:
    """One message of the history sent to the model.

    ``model`` is the model that wrote an assistant message: reasoning is
    replayed only to that same provider and model.
    """

    role: Role = attrs.field(validator=attrs.validators.in_(tuple(_ALLOWED)))
    parts: tuple[ContentPart, ...] = attrs.field(validator=_check_parts)
    model: ModelRef | None = None

    @property
    def text(self) -> str:
        """The message's text parts joined by newlines (reasoning excluded)."""
        return "\n".join(p.text for p in self.parts if isinstance(p, TextContent))


@attrs.frozen(kw_only=True)
class ModelRequest:
    """Everything a provider needs for one model call.

    ``tool_choice="none"`` keeps ``tools`` in the request (so a provider's
    prompt cache still matches) but forbids calling them; the drain sets it,
    with ``max_steps_reached``, through :func:`actors.llm.with_max_steps`.

    ``metadata`` is for the runtime and the scripted provider, never sent to
    a real model: ``attempt`` is the physical attempt number of this step
    (1 for the first try), ``script`` the configured script, if any.
    """

    session_id: str
    agent: str
    model: ModelRef
    system: tuple[str, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "none"))
    )
    max_steps_reached: bool = False
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


def bounded_result(output: str) -> str:
    """``output`` cut to :data:`TOOL_RESULT_MAX_CHARS`, saying so when cut."""
    if len(output) <= TOOL_RESULT_MAX_CHARS:
        return output
    return output[:TOOL_RESULT_MAX_CHARS] + "\n[tool result truncated]"
