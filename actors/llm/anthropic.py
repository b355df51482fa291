"""The Anthropic Messages adapter: :class:`AnthropicProvider`.

``POST {base_url}/v1/messages`` with ``stream: true``, the ``x-api-key`` and
``anthropic-version: 2023-06-01`` headers, answered by named SSE events:

    message_start        the message, with the input usage
    content_block_start  index and block: text, thinking, tool_use,
                         server_tool_use (a hosted call), *_tool_result
                         (a hosted call's result; others ignored)
    content_block_delta  text_delta, thinking_delta, signature_delta, input_json_delta
    content_block_stop   the block at index is complete
    message_delta        stop_reason and the cumulative output usage
    message_stop         the end: the stream's Finish
    ping                 a keep-alive
    error                a failure in the middle of the stream

A body that ends or breaks before ``message_stop`` is an
:class:`IncompleteStreamError`. A gateway that answers the stream request with
the whole message as ``application/json`` (LiteLLM's proxy does for a mock
model) is read as that message: its content blocks become the same parts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

import orjson

from actors.llm._anthropic_body import anthropic_body
from actors.llm._classify import classify
from actors.llm._config import ProviderConfig
from actors.llm._errors import IncompleteStreamError, ProviderError
from actors.llm._http import HttpTransport, JSONAnswer, error_body, normalized
from actors.llm._request import ModelRequest
from actors.llm._stream import (
    Finish,
    FinishReason,
    HostedResult,
    ReasoningChunk,
    ReasoningEnd,
    ReasoningStart,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
    Usage,
)
from actors.llm.openai import decode_arguments
from protocol.sse import SSEFrame

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider", "AnthropicStream"]

log = logging.getLogger(__name__)

ANTHROPIC_VERSION: Final = "2023-06-01"

_FINISH: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool-calls",
    "refusal": "content-filter",
}


class _Block:
    __slots__ = ("args", "id", "kind", "name", "ordinal", "signature", "start_input")

    def __init__(self, kind: str, ordinal: int = -1, id: str = "", name: str = "") -> None:
        self.kind = kind
        self.ordinal = ordinal
        self.id = id
        self.name = name
        self.args: list[str] = []
        self.signature: str | None = None
        self.start_input: dict[str, Any] = {}


class AnthropicStream:
    """The normalized parts of one Messages stream, event by event."""

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._ordinal = 0
        self._blocks: dict[int, _Block] = {}
        self._reason: FinishReason | None = None
        self._usage: dict[str, int] = {}
        self.done = False
        self.produced = False

    def event(self, event: SSEFrame) -> list[StreamPart]:
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            raise self.incomplete("an unreadable stream event") from None
        if not isinstance(data, dict):
            return []
        return self._event(data, data.get("type", event.event))

    def answer(self, answer: JSONAnswer) -> list[StreamPart]:
        """A whole Messages response, as the events that would have streamed it."""
        data = answer.data
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "error":
            return self._event(data, kind)
        if kind != "message" or not isinstance(data.get("content"), list):
            raise self.incomplete(f"the provider answered {answer.content_type} with no message")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        out = self._event({"message": {"usage": usage}}, "message_start")
        for index, block in enumerate(data["content"]):
            if not isinstance(block, dict):
                continue
            out += self._event({"index": index, "content_block": block}, "content_block_start")
            delta: dict[str, Any] | None = None
            if block.get("type") == "tool_use" and block.get("input"):
                arguments = orjson.dumps(block["input"]).decode()
                delta = {"type": "input_json_delta", "partial_json": arguments}
            elif block.get("type") == "thinking" and isinstance(block.get("signature"), str):
                delta = {"type": "signature_delta", "signature": block["signature"]}
            if delta is not None:
                out += self._event({"index": index, "delta": delta}, "content_block_delta")
            out += self._event({"index": index}, "content_block_stop")
        out += self._event(
            {"delta": {"stop_reason": data.get("stop_reason")}, "usage": usage}, "message_delta"
        )
        return out + self._event({}, "message_stop")

    def _event(self, data: Mapping[str, Any], kind: Any) -> list[StreamPart]:
        out: list[StreamPart] = []
        if kind == "content_block_delta":
            self._delta(data, out)
        elif kind == "content_block_start":
            self._start(data, out)
        elif kind == "content_block_stop":
            self._stop(data, out)
        elif kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict) and isinstance(message.get("usage"), dict):
                self._merge_usage(message["usage"])
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self._reason = _FINISH.get(delta["stop_reason"], "other")
            if isinstance(data.get("usage"), dict):
                self._merge_usage(data["usage"])
        elif kind == "message_stop":
            for index in list(self._blocks):
                self._stop({"index": index}, out)
            out.append(Finish(reason=self._reason or "unknown", usage=self._final_usage()))
            self.done = True
        elif kind == "error":
            error = data.get("error")
            raise self._error(error if isinstance(error, dict) else {})
        # ping and event types added later mean nothing here
        return out

    def end(self) -> list[StreamPart]:
        raise self.incomplete("the stream ended before message_stop")

    def incomplete(self, why: str) -> IncompleteStreamError:
        after = "after output was produced" if self.produced else "before any output"
        return IncompleteStreamError(f"provider {self._provider!r}: {why} ({after})")

    def _start(self, data: Mapping[str, Any], out: list[StreamPart]) -> None:
        index, block = data.get("index"), data.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            return
        kind = block.get("type")
        if kind == "text":
            self._blocks[index] = _Block("text", self._ordinal)
            out.append(TextStart(ordinal=self._ordinal))
            self._ordinal += 1
            self._text(index, block.get("text"), out)
        elif kind == "thinking":
            self._blocks[index] = _Block("thinking", self._ordinal)
            out.append(ReasoningStart(ordinal=self._ordinal))
            self._ordinal += 1
            self._text(index, block.get("thinking"), out)
        elif kind in ("tool_use", "server_tool_use"):
            call_id, name = str(block.get("id", f"toolu_{index}")), str(block.get("name", ""))
            self._blocks[index] = _Block(
                "tool" if kind == "tool_use" else "hosted", id=call_id, name=name
            )
            if kind == "server_tool_use" and isinstance(block.get("input"), dict):
                # Its input may come whole here rather than as deltas.
                self._blocks[index].start_input = block["input"]
            out.append(ToolInputStart(id=call_id, name=name))
        elif (
            isinstance(kind, str)
            and kind.endswith("_tool_result")
            and isinstance(block.get("tool_use_id"), str)
        ):
            # A hosted call's result arrives whole in its start event.
            content = block.get("content")
            error = isinstance(content, dict) and str(content.get("type", "")).endswith("_error")
            out.append(HostedResult(id=block["tool_use_id"], content=block, error=error))
        else:
            return
        self.produced = True

    def _delta(self, data: Mapping[str, Any], out: list[StreamPart]) -> None:
        index, delta = data.get("index"), data.get("delta")
        if not isinstance(index, int) or not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta":
            self._text(index, delta.get("text"), out)
        elif kind == "thinking_delta":
            self._text(index, delta.get("thinking"), out)
        elif kind == "signature_delta":
            block = self._blocks.get(index)
            if block is not None and isinstance(delta.get("signature"), str):
                block.signature = (block.signature or "") + delta["signature"]
        elif kind == "input_json_delta":
            block = self._blocks.get(index)
            piece = delta.get("partial_json")
            if (
                block is not None
                and block.kind in ("tool", "hosted")
                and isinstance(piece, str)
                and piece
            ):
                block.args.append(piece)
                out.append(ToolInputChunk(id=block.id, delta=piece))

    def _text(self, index: int, text: Any, out: list[StreamPart]) -> None:
        block = self._blocks.get(index)
        if block is None or not isinstance(text, str) or not text:
            return
        if block.kind == "text":
            out.append(TextChunk(ordinal=block.ordinal, delta=text))
        elif block.kind == "thinking":
            out.append(ReasoningChunk(ordinal=block.ordinal, delta=text))

    def _stop(self, data: Mapping[str, Any], out: list[StreamPart]) -> None:
        index = data.get("index")
        block = self._blocks.pop(index, None) if isinstance(index, int) else None
        if block is None:
            return
        if block.kind == "text":
            out.append(TextEnd(ordinal=block.ordinal))
        elif block.kind == "thinking":
            out.append(ReasoningEnd(ordinal=block.ordinal, signature=block.signature))
        else:
            out.append(ToolInputEnd(id=block.id))
            out.append(
                ToolCall(
                    id=block.id,
                    name=block.name,
                    input=(
                        decode_arguments("".join(block.args)) if block.args else block.start_input
                    ),
                    hosted=block.kind == "hosted",
                )
            )

    def _merge_usage(self, usage: Mapping[str, Any]) -> None:
        for key, value in usage.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self._usage[key] = value

    def _final_usage(self) -> Usage:
        u = self._usage
        return Usage(
            input=u.get("input_tokens", 0),
            output=u.get("output_tokens", 0),
            cache_read=u.get("cache_read_input_tokens", 0),
            cache_write=u.get("cache_creation_input_tokens", 0),
        )

    def _error(self, error: Mapping[str, Any]) -> ProviderError:
        etype = error.get("type")
        message = error.get("message")
        return classify(
            provider=self._provider,
            status=None,
            headers={},
            etype=etype if isinstance(etype, str) else None,
            code=None,
            message=message if isinstance(message, str) else "",
        )


class AnthropicProvider:
    """A :class:`~actors.llm.Provider` for one ``kind = "anthropic"`` configuration."""

    def __init__(self, config: ProviderConfig, transport: HttpTransport | None = None) -> None:
        self.config = config
        self.transport = transport or HttpTransport(config)
        self._url = config.base_url.rstrip("/") + "/v1/messages"

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        key = self.config.api_key()
        limits = self.config.models.get(request.model.id)
        body = anthropic_body(request, limits.output if limits is not None else None)
        headers = {
            **self.config.headers,
            "accept": "text/event-stream",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if key:
            headers["x-api-key"] = key
        name = self.config.id
        state = AnthropicStream(name)
        log.debug("provider %s: messages call for model %s", name, request.model.id)
        scrub = self.transport.scrub

        def failure(status: int, hdrs: Mapping[str, str], raw: bytes) -> ProviderError:
            error = error_body(raw)
            etype, message = error.get("type"), error.get("message")
            return classify(
                provider=name,
                status=status,
                headers=hdrs,
                etype=scrub(etype, key) if isinstance(etype, str) else None,
                code=None,
                message=scrub(message, key) if isinstance(message, str) else "",
            )

        async with contextlib.aclosing(
            normalized(self.transport, self._url, headers, body, failure, state, key)
        ) as parts:
            async for part in parts:
                yield part
