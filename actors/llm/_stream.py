"""The normalized stream a provider yields for one model call.

A stream is a sequence of parts that ends with exactly one :class:`Finish`, or
raises a :class:`~actors.llm.ProviderError` instead (never both, never a part
after the finish)::

    (TextStart TextChunk* TextEnd
     | ReasoningStart ReasoningChunk* ReasoningEnd
     | ToolInputStart ToolInputChunk* ToolInputEnd ToolCall
     | HostedResult)*
    Finish

Text and reasoning blocks are numbered together by ``ordinal`` from 0 in
stream order, so an ordinal names one block within a step. A tool call is
named by its provider-assigned ``id``, unique within the step only. The
concatenated ``ToolInputChunk.delta`` values are the raw JSON text of the
input that the closing :class:`ToolCall` carries decoded. The step publishes
each chunk as the live event of the same meaning (:class:`TextChunk` as
``protocol.events.TextDelta`` …).

A *hosted* call (``ToolCall.hosted``) is one the provider executes itself
(Anthropic's ``server_tool_use``, e.g. web search): the runtime records it
but never runs it. Its outcome arrives later in the same stream as a
:class:`HostedResult` with the same ``id``, or never (the step then fails
the call with ``tool.result-missing``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from protocol.shapes import CacheTokens, Tokens

__all__ = [
    "FINISH_REASONS",
    "Finish",
    "FinishReason",
    "HostedResult",
    "ReasoningChunk",
    "ReasoningEnd",
    "ReasoningStart",
    "StreamPart",
    "TextChunk",
    "TextEnd",
    "TextStart",
    "ToolCall",
    "ToolInputChunk",
    "ToolInputEnd",
    "ToolInputStart",
    "Usage",
]

FinishReason = Literal["stop", "tool-calls", "length", "content-filter", "other", "unknown"]
FINISH_REASONS: Final[tuple[FinishReason, ...]] = (
    "stop",
    "tool-calls",
    "length",
    "content-filter",
    "other",
    "unknown",
)


@attrs.frozen(kw_only=True)
class Usage:
    """What one model call consumed, in tokens, and what it cost."""

    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0

    def to_tokens(self) -> Tokens:
        """The public token counts (:class:`protocol.shapes.Tokens`) of this usage."""
        return Tokens(
            input=self.input,
            output=self.output,
            reasoning=self.reasoning,
            cache=CacheTokens(read=self.cache_read, write=self.cache_write),
        )


@attrs.frozen(kw_only=True)
class TextStart:
    ordinal: int


@attrs.frozen(kw_only=True)
class TextChunk:
    ordinal: int
    delta: str


@attrs.frozen(kw_only=True)
class TextEnd:
    ordinal: int


@attrs.frozen(kw_only=True)
class ReasoningStart:
    ordinal: int


@attrs.frozen(kw_only=True)
class ReasoningChunk:
    ordinal: int
    delta: str


@attrs.frozen(kw_only=True)
class ReasoningEnd:
    """The end of a reasoning block; ``signature`` is what replaying it needs (Anthropic)."""

    ordinal: int
    signature: str | None = None


@attrs.frozen(kw_only=True)
class ToolInputStart:
    id: str
    name: str


@attrs.frozen(kw_only=True)
class ToolInputChunk:
    id: str
    delta: str


@attrs.frozen(kw_only=True)
class ToolInputEnd:
    id: str


@attrs.frozen(kw_only=True)
class ToolCall:
    """A complete tool call: the model asked for ``name`` with ``input``."""

    id: str
    name: str
    input: Mapping[str, Any]
    #: Executed by the provider, not by a local tool.
    hosted: bool = False


@attrs.frozen(kw_only=True)
class HostedResult:
    """The provider's result of the hosted call ``id``.

    ``content`` is the result block as the provider gave it (what native
    replay sends back), ``error`` whether the provider reports a failure.
    """

    id: str
    content: Mapping[str, Any]
    error: bool = False


@attrs.frozen(kw_only=True)
class Finish:
    """The last part of every successful stream."""

    reason: FinishReason = attrs.field(validator=attrs.validators.in_(FINISH_REASONS))
    usage: Usage = attrs.field(factory=Usage)


StreamPart = (
    TextStart
    | TextChunk
    | TextEnd
    | ReasoningStart
    | ReasoningChunk
    | ReasoningEnd
    | ToolInputStart
    | ToolInputChunk
    | ToolInputEnd
    | ToolCall
    | HostedResult
    | Finish
)
