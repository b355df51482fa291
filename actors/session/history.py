"""From projected Session History to the model's view of it.

The drain never keeps a conversation in memory between steps: before each
step it reloads the projected transcript and turns it into the normalized
request messages here. Tool parts become an assistant tool call plus a tool
result message; a call that never settled (it cannot, by the time a step is
built) is sent as an error result so the model sees what happened.

A hosted call (its terminal's metadata says ``providerExecuted``) stays in
the assistant message as :class:`~actors.llm.HostedContent`: its result
block for native replay and the same as plain text for everything else
(another model, a full rebuild, a provider without hosted items).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import orjson

from actors.llm import (
    ChatMessage,
    ContentPart,
    FileContent,
    HostedContent,
    ReasoningContent,
    TextContent,
    ToolCallContent,
    ToolResultContent,
)
from actors.session.compaction import render
from actors.session.tool_calls import HOSTED
from protocol.lru import ByteLRU, reused_prefix
from protocol.shapes import (
    AssistantMessage,
    CompactionMessage,
    ReasoningPart,
    SessionMessage,
    ShellMessage,
    SyntheticMessage,
    SystemMessage,
    TextPart,
    ToolPart,
    UserMessage,
)
from protocol.untrack import untrack_tail, untracked_tuple

__all__ = ["CHAT_CACHE_BYTES", "ChatCache", "to_chat"]

#: Bytes of converted messages kept, least recently used evicted first.
CHAT_CACHE_BYTES: Final = 32 * 1024 * 1024


@attrs.frozen
class _Converted:
    """A session's last converted history: each message's output, flattened.

    ``counts[i]`` and ``weights[i]`` are the model messages and bytes that
    ``history[:i]`` converts to, so a prefix of it is reused by slicing.
    """

    history: tuple[SessionMessage, ...]
    chat: tuple[ChatMessage, ...]
    counts: tuple[int, ...]
    weights: tuple[int, ...]


class ChatCache:
    """Converted messages by the identity of their decoded value, bounded by bytes.

    The store hands back the same decoded object for an unchanged stored row
    (and a new one when the row changed), so identity is a safe key as long as
    the object is kept alive here with its conversion. Keeping it alive is what
    costs memory (the store's own cache may have let it go), so an entry weighs
    the text and data its conversion holds.
    """

    def __init__(self, max_bytes: int = CHAT_CACHE_BYTES) -> None:
        # ``(message, *its conversion)``: one tuple an entry, not a pair holding
        # a tuple, so one object less for every full collection to walk.
        self._entries: ByteLRU[int, tuple[SessionMessage | ChatMessage, ...]] = ByteLRU(max_bytes)
        # By session: its last whole conversion, bounded by the bytes it
        # holds (the same bound again: it may keep alive what the entries let go).
        self._sessions: ByteLRU[str, _Converted] = ByteLRU(max_bytes)

    @property
    def bytes(self) -> int:
        return self._entries.bytes

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    def get(self, message: SessionMessage) -> tuple[ChatMessage, ...]:
        entry = self._entries.get(id(message))
        if entry is not None and entry[0] is message:
            return entry[1:]  # type: ignore[return-value]  # the rest are its ChatMessages
        converted = _convert(message)
        self._entries.put(id(message), (message, *converted), _weight(converted))
        return converted

    def history(self, history: Sequence[SessionMessage]) -> tuple[ChatMessage, ...]:
        """The conversion of a whole history, reusing the session's last one.

        Looking every message up again made the conversion grow with the
        session; a step's history is the last one with a few messages added or
        changed at its end, so the longest prefix equal to the last one's
        (compared in C: the unchanged messages are the same objects) keeps
        its converted messages, and only the rest is converted.
        """
        current = tuple(history)
        if not current:
            return ()
        session_id = current[0].session_id
        last = self._sessions.get(session_id)
        keep = 0 if last is None else reused_prefix(current, last.history)
        # How much of the new tuples is the last conversion's, known untracked
        # (protocol.untrack): only the rest is walked when this one is kept.
        known = last is not None and keep and not gc.is_tracked(last.chat)
        chat = list(last.chat[: last.counts[keep]]) if last is not None and keep else []
        counts = list(last.counts[: keep + 1]) if last is not None and keep else [0]
        weights = list(last.weights[: keep + 1]) if last is not None and keep else [0]
        for message in current[keep:]:
            converted = self.get(message)
            chat.extend(converted)
            counts.append(counts[-1] + len(converted))
            weights.append(weights[-1] + _weight(converted))
        result = tuple(chat)
        if known:
            assert last is not None
            untrack_tail(current, keep)
            untrack_tail(result, last.counts[keep])
        entry = _Converted(
            history=current,
            chat=result,
            counts=untracked_tuple(counts),
            weights=untracked_tuple(weights),
        )
        self._sessions.put(session_id, entry, weights[-1] + 16 * len(current))
        return result


def _weight(messages: tuple[ChatMessage, ...]) -> int:
    """The bytes of text and data the converted messages hold (small fields aside)."""
    total = 0
    for chat in messages:
        for part in chat.parts:
            match part:
                case TextContent(text=text) | ReasoningContent(text=text):
                    total += sys.getsizeof(text)
                case FileContent(data=data):
                    total += sys.getsizeof(data)
                case ToolResultContent(output=output):
                    total += sys.getsizeof(output)
                case ToolCallContent(input=value):
                    total += _json_weight(value)
                case HostedContent(text=text, result=result):
                    total += sys.getsizeof(text) + _json_weight(result)
    return total


def _json_weight(value: object) -> int:
    if isinstance(value, str):
        return sys.getsizeof(value)
    if isinstance(value, dict):
        return sum(_json_weight(k) + _json_weight(v) for k, v in value.items()) + 64
    if isinstance(value, list | tuple):
        return sum(_json_weight(v) for v in value) + 56
    return 32


def to_chat(
    history: Sequence[SessionMessage], cache: ChatCache | None = None, *, native: bool = True
) -> tuple[ChatMessage, ...]:
    """The model's view of ``history``; ``native=False`` drops provider-native state."""
    if cache is None:
        chat = tuple(chat for message in history for chat in _convert(message))
    else:
        chat = cache.history(history)
    return chat if native else tuple(_without_native(m) for m in chat)


def _without_native(message: ChatMessage) -> ChatMessage:
    if not any(
        (isinstance(p, ReasoningContent) and p.signature) or isinstance(p, HostedContent)
        for p in message.parts
    ):
        return message
    parts = tuple(
        attrs.evolve(p, signature=None)
        if isinstance(p, ReasoningContent)
        else TextContent(text=p.text)
        if isinstance(p, HostedContent)
        else p
        for p in message.parts
    )
    return attrs.evolve(message, parts=parts)


def _convert(message: SessionMessage) -> tuple[ChatMessage, ...]:
    match message:
        case UserMessage():
            parts: list[ContentPart] = []
            if message.text:
                parts.append(TextContent(text=message.text))
            for f in message.files or ():
                parts.append(FileContent(mime=f.mime, data=f.data, name=f.name))
            return (ChatMessage(role="user", parts=tuple(parts)),) if parts else ()
        case SyntheticMessage():
            return (ChatMessage(role="user", parts=(TextContent(text=message.text),)),)
        case SystemMessage():
            return (ChatMessage(role="system", parts=(TextContent(text=message.text),)),)
        case AssistantMessage():
            return tuple(_assistant(message))
        case ShellMessage():
            # The model sees a shell through its notice (synthetic input), once.
            return ()
        case CompactionMessage():
            # The boundary of the active history: summary and tail as plain
            # text, never any provider-native state. Running or failed: nothing.
            if message.status != "completed":
                return ()
            return (ChatMessage(role="user", parts=(TextContent(text=render(message)),)),)


def _assistant(message: AssistantMessage) -> list[ChatMessage]:
    parts: list[ContentPart] = []
    results: list[ContentPart] = []
    signatures = _signatures(message)
    for part in message.parts:
        match part:
            case TextPart(text=text) if text:
                parts.append(TextContent(text=text))
            case ReasoningPart(text=text) if text:
                signature = signatures.get(str(part.ordinal))
                parts.append(ReasoningContent(text=text, signature=signature))
            case ToolPart() if part.metadata is not None and part.metadata.get(HOSTED):
                parts.append(_hosted(part, native=message.error is None))
            case ToolPart():
                parts.append(ToolCallContent(id=part.id, name=part.name, input=part.input or {}))
                results.append(_result(part))
    out = []
    if parts:
        out.append(ChatMessage(role="assistant", parts=tuple(parts), model=message.model))
    if results:
        out.append(ChatMessage(role="tool", parts=tuple(results)))
    return out


def _signatures(message: AssistantMessage) -> Mapping[str, str]:
    """The step's reasoning signatures (``providerState``), for a step that succeeded.

    A failed step's native state is never replayed (seeds); whether the next
    request goes to the same provider and model, where alone it may be sent,
    is the adapter's check (``ChatMessage.model``).
    """
    state = message.provider_state
    if state is None or message.error is not None:
        return {}
    reasoning = state.get("reasoning")
    if not isinstance(reasoning, Mapping):
        return {}
    return {str(k): v for k, v in reasoning.items() if isinstance(v, str)}


def _result(part: ToolPart) -> ToolResultContent:
    if part.status == "completed":
        texts = [str(c.get("text", "")) for c in part.content or () if c.get("type") == "text"]
        return ToolResultContent(id=part.id, name=part.name, output="\n".join(texts))
    if part.status == "error" and part.error is not None:
        message = str(part.error.get("message", "")) or orjson.dumps(part.error).decode()
        return ToolResultContent(id=part.id, name=part.name, output=message, is_error=True)
    return ToolResultContent(
        id=part.id, name=part.name, output="Tool call did not complete", is_error=True
    )


def _hosted(part: ToolPart, *, native: bool) -> HostedContent:
    """A hosted call; its result block is kept for a succeeded step's native replay."""
    outcome = _result(part)
    call = orjson.dumps(part.input or {}).decode()
    state = "failed" if outcome.is_error else "returned"
    text = f"[{part.name} {call}, executed by the provider, {state}: {outcome.output}]"
    raw = part.metadata.get("result") if native and part.metadata is not None else None
    return HostedContent(
        id=part.id,
        name=part.name,
        input=part.input or {},
        result=raw if isinstance(raw, Mapping) else None,
        text=text,
    )
