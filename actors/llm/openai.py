"""The OpenAI-compatible Chat Completions adapter: :class:`OpenAIProvider`.

One adapter for OpenAI, vLLM, llama.cpp's server, Ollama's ``/v1``,
OpenRouter, Groq and the like: ``POST {base_url}/chat/completions`` with
``stream: true`` and ``stream_options.include_usage``, answered by
``data: {chunk}`` events and a last ``data: [DONE]``.

A chunk's ``choices[0].delta`` carries ``content`` (text), ``reasoning_content``
or ``reasoning`` (reasoning, where the server sends it) and ``tool_calls``
deltas keyed by ``index`` (the first delta of a call has its ``id`` and
``function.name``; ``function.arguments`` arrives as pieces of JSON text).
``finish_reason`` comes on the last choice chunk; with ``include_usage`` a
final chunk with empty ``choices`` carries ``usage``. An ``error`` object in
the stream (some compatible servers send one) is a failure.

The stream ends with :class:`Finish` at ``[DONE]``, or at the end of the
body when a finish reason was seen (servers that omit ``[DONE]``); a body
that ends or breaks before any finish reason is an
:class:`IncompleteStreamError`. A gateway that answers the stream request
with a whole ``chat.completion`` as ``application/json`` is read as that
completion: its message becomes one chunk's delta.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

import orjson

from actors.llm._classify import classify
from actors.llm._config import ProviderConfig
from actors.llm._errors import IncompleteStreamError, ProviderError
from actors.llm._http import HttpTransport, JSONAnswer, error_body, normalized
from actors.llm._openai_body import openai_body
from actors.llm._request import ModelRequest
from actors.llm._stream import (
    Finish,
    FinishReason,
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
from protocol.sse import SSEFrame

__all__ = ["OpenAIProvider", "OpenAIStream"]

log = logging.getLogger(__name__)

_FINISH: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "content_filter": "content-filter",
}


def decode_arguments(text: str) -> dict[str, Any]:
    """A call's streamed JSON arguments; unreadable or non-object text gives ``{}``.

    The tool then rejects the input with its own schema error, which the
    model sees, rather than the whole step failing on one malformed call.
    """
    if not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class OpenAIStream:
    """The normalized parts of one Chat Completions stream, event by event."""

    def __init__(self, provider: str, ids: itertools.count[int] | None = None) -> None:
        self._provider = provider
        self._ordinal = 0
        self._open: tuple[str, int] | None = None  # ("text" | "reasoning", ordinal)
        self._tool: tuple[int, str, str] | None = None  # (index, id, name)
        self._args: list[str] = []
        self._done_indexes: set[int] = set()
        self._ids = ids or itertools.count()
        self._reason: FinishReason | None = None
        self._usage = Usage()
        self.done = False
        self.produced = False

    def event(self, event: SSEFrame) -> list[StreamPart]:
        if event.data == "[DONE]":
            return self.end()
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            raise IncompleteStreamError(
                f"provider {self._provider!r} sent an unreadable stream chunk"
            ) from None
        if not isinstance(chunk, dict):
            return []
        return self._chunk(chunk)

    def answer(self, answer: JSONAnswer) -> list[StreamPart]:
        """A whole chat completion, as the one chunk that would have streamed it."""
        data = answer.data
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raise self._error(data["error"])
        choices = data.get("choices") if isinstance(data, dict) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        choice: Mapping[str, Any] = first if isinstance(first, dict) else {}
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self.incomplete(f"the provider answered {answer.content_type} with no message")
        calls = message.get("tool_calls")
        delta = {
            "content": message.get("content"),
            "reasoning_content": message.get("reasoning_content") or message.get("reasoning"),
            "tool_calls": [
                {**call, "index": index}
                for index, call in enumerate(calls if isinstance(calls, list) else ())
                if isinstance(call, dict)
            ],
        }
        out = self._chunk(
            {
                "choices": [{"delta": delta, "finish_reason": choice.get("finish_reason")}],
                "usage": data.get("usage"),
            }
        )
        return out + self.end()

    def _chunk(self, chunk: Mapping[str, Any]) -> list[StreamPart]:
        out: list[StreamPart] = []
        error = chunk.get("error")
        if isinstance(error, dict):
            raise self._error(error)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage(usage)
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out)
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self._close_all(out)
                self._reason = _FINISH.get(reason, "other")
        return out

    def end(self) -> list[StreamPart]:
        """The closing parts once the body ended; raises if it never finished."""
        if self._reason is None:
            raise self.incomplete("the stream ended without a finish reason")
        out: list[StreamPart] = []
        self._close_all(out)
        self.done = True
        reason = self._reason
        if reason == "stop" and self._done_indexes:
            reason = "tool-calls"  # some servers say "stop" after calling tools
        out.append(Finish(reason=reason, usage=self._usage))
        return out

    def incomplete(self, why: str) -> IncompleteStreamError:
        after = "after output was produced" if self.produced else "before any output"
        return IncompleteStreamError(f"provider {self._provider!r}: {why} ({after})")

    def _delta(self, delta: Mapping[str, Any], out: list[StreamPart]) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self._block("reasoning", out)
            out.append(ReasoningChunk(ordinal=self._ordinal - 1, delta=reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._block("text", out)
            out.append(TextChunk(ordinal=self._ordinal - 1, delta=content))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    self._call(call, out)

    def _block(self, kind: str, out: list[StreamPart]) -> None:
        self.produced = True
        if self._open is not None and self._open[0] == kind:
            return
        self._close_all(out)
        self._open = (kind, self._ordinal)
        out.append(
            TextStart(ordinal=self._ordinal)
            if kind == "text"
            else ReasoningStart(ordinal=self._ordinal)
        )
        self._ordinal += 1

    def _call(self, call: Mapping[str, Any], out: list[StreamPart]) -> None:
        index = call.get("index", 0)
        if not isinstance(index, int):
            index = 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if self._tool is None or self._tool[0] != index:
            if index in self._done_indexes:
                raise self.incomplete("tool call deltas arrived out of order")
            self._close_all(out)
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"call_{next(self._ids)}"
            name = function.get("name")
            self._tool = (index, call_id, name if isinstance(name, str) else "")
            self._args = []
            self.produced = True
            out.append(ToolInputStart(id=call_id, name=self._tool[2]))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._args.append(arguments)
            out.append(ToolInputChunk(id=self._tool[1], delta=arguments))

    def _close_all(self, out: list[StreamPart]) -> None:
        if self._open is not None:
            kind, ordinal = self._open
            out.append(
                TextEnd(ordinal=ordinal) if kind == "text" else ReasoningEnd(ordinal=ordinal)
            )
            self._open = None
        if self._tool is not None:
            index, call_id, name = self._tool
            out.append(ToolInputEnd(id=call_id))
            out.append(ToolCall(id=call_id, name=name, input=decode_arguments("".join(self._args))))
            self._done_indexes.add(index)
            self._tool = None
            self._args = []

    def _error(self, error: Mapping[str, Any]) -> ProviderError:
        return classify(
            provider=self._provider,
            status=None,
            headers={},
            etype=_str(error.get("type")),
            code=_str(error.get("code")),
            message=_str(error.get("message")) or "",
        )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else (str(value) if isinstance(value, int) else None)


def _usage(raw: Mapping[str, Any]) -> Usage:
    prompt = _int(raw.get("prompt_tokens"))
    details = raw.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    completion = raw.get("completion_tokens_details")
    reasoning = _int(completion.get("reasoning_tokens")) if isinstance(completion, dict) else 0
    return Usage(
        input=max(0, prompt - cached),
        output=_int(raw.get("completion_tokens")),
        reasoning=reasoning,
        cache_read=cached,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class OpenAIProvider:
    """A :class:`~actors.llm.Provider` for one ``kind = "openai"`` configuration."""

    def __init__(self, config: ProviderConfig, transport: HttpTransport | None = None) -> None:
        self.config = config
        self.transport = transport or HttpTransport(config)
        self._url = config.base_url.rstrip("/") + "/chat/completions"

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        key = self.config.api_key()
        limits = self.config.models.get(request.model.id)
        body = openai_body(request, limits.output if limits is not None else None)
        headers = {**self.config.headers, "accept": "text/event-stream"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        name = self.config.id
        state = OpenAIStream(name)
        log.debug("provider %s: chat completion for model %s", name, request.model.id)

        def failure(status: int, hdrs: Mapping[str, str], raw: bytes) -> ProviderError:
            error = error_body(raw)
            return classify(
                provider=name,
                status=status,
                headers=hdrs,
                etype=_scrubbed(self.transport, _str(error.get("type")), key),
                code=_scrubbed(self.transport, _str(error.get("code")), key),
                message=self.transport.scrub(_str(error.get("message")) or "", key),
            )

        async with contextlib.aclosing(
            normalized(self.transport, self._url, headers, body, failure, state, key)
        ) as parts:
            async for part in parts:
                yield part


def _scrubbed(transport: HttpTransport, value: str | None, key: str | None) -> str | None:
    return None if value is None else transport.scrub(value, key)
