"""A scriptable fake model provider: a real aiohttp server on loopback.

It speaks both wire formats as the providers document them:

- OpenAI Chat Completions at ``POST /v1/chat/completions``: ``data: {chunk}``
  SSE frames and a last ``data: [DONE]``; errors as
  ``{"error": {"message", "type", "param", "code"}}`` with ``x-request-id``;
- Anthropic Messages at ``POST /v1/messages``: ``event: <type>`` +
  ``data: {event}`` frames; errors as
  ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with
  ``request-id``.

Each test queues :class:`Reply` values (stream these frames, cut or reset the
connection after N of them, hang, answer status X with body Y); every request
received is recorded (:class:`Received`) so tests can assert what was sent.
The builders below (:func:`openai_text`, :func:`anthropic_text`, …) make the
frames; a test may also pass raw bytes cut anywhere.

    async with FakeProvider() as fake:
        fake.replies.append(Reply.stream(openai_text(["Hel", "lo"])))
        ... base_url = fake.openai_url (…/v1) or fake.anthropic_url (the root)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Self

import attrs
import orjson
from aiohttp import web

__all__ = [
    "FakeProvider",
    "Received",
    "Reply",
    "anthropic_error",
    "anthropic_events",
    "anthropic_text",
    "anthropic_tool_calls",
    "openai_chunks",
    "openai_error",
    "openai_text",
    "openai_tool_calls",
]


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted answer.

    ``frames`` are written one ``write`` each; with ``cut_after`` the answer
    ends cleanly after that many frames (a stream without its finish), with
    ``reset_after`` the connection is aborted after that many (``0``: before
    the status line); ``hang`` keeps the connection open and silent after
    the frames until the server closes.
    """

    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)
    frames: tuple[bytes, ...] = ()
    body: bytes | None = None
    cut_after: int | None = None
    reset_after: int | None = None
    hang: bool = False
    stall: bool = False
    #: Written ``tail_delay_s`` after the frames, before the end of the body:
    #: bytes a client must still read to keep the connection reusable.
    tail: bytes = b""
    tail_delay_s: float = 0.0

    @classmethod
    def stream(cls, frames: Iterable[bytes], **kw: Any) -> Reply:
        return cls(frames=tuple(frames), **kw)

    @classmethod
    def error(cls, status: int, body: Mapping[str, Any], **headers: str) -> Reply:
        return cls(status=status, body=orjson.dumps(body), headers=headers)


@attrs.frozen(kw_only=True)
class Received:
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    #: The client's address: the same one twice means the connection was reused.
    peer: Any = None
    #: When the request arrived, epoch ms (wall clock, like ``retry.scheduled.at``).
    time_ms: int = 0


class FakeProvider:
    def __init__(self) -> None:
        self.replies: collections.deque[Reply] = collections.deque()
        self.received: list[Received] = []
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/messages", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        self.port = 0

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def anthropic_url(self) -> str:
        return self.root

    async def __aenter__(self) -> Self:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release.set()
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.received.append(
            Received(
                path=request.path,
                headers=dict(request.headers),
                body=body,
                peer=peer,
                time_ms=int(time.time() * 1000),
            )
        )
        if not self.replies:
            return web.json_response({"error": {"message": "no scripted reply"}}, status=500)
        reply = self.replies.popleft()
        if reply.stall:
            await self._release.wait()
        if reply.reset_after == 0:
            _abort(request)
            return web.Response()
        if reply.body is not None:
            return web.Response(
                status=reply.status,
                body=reply.body,
                headers={"content-type": "application/json", **reply.headers},
            )
        response = web.StreamResponse(
            status=reply.status,
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                **reply.headers,
            },
        )
        await response.prepare(request)
        for n, frame in enumerate(reply.frames):
            if n == reply.cut_after:
                break
            if n == reply.reset_after:
                _abort(request)
                return response
            await response.write(frame)
        if reply.reset_after is not None and reply.reset_after >= len(reply.frames):
            _abort(request)
            return response
        if reply.tail:
            await asyncio.sleep(reply.tail_delay_s)  # a slow network, simulated
            await response.write(reply.tail)
        if reply.hang:
            await self._release.wait()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


# -- OpenAI Chat Completions frames -------------------------------------------------------------


def _openai_frame(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def openai_chunks(
    deltas: Sequence[Mapping[str, Any]],
    *,
    finish: str | None = "stop",
    usage: Mapping[str, Any] | None = None,
    done: bool = True,
    model: str = "fake-model",
) -> list[bytes]:
    """Frames for these ``choices[0].delta`` values, the finish chunk, usage and [DONE]."""
    head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model}

    def chunk(delta: Mapping[str, Any], reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return _openai_frame({**head, "choices": [choice], "usage": None})

    frames = [chunk({"role": "assistant", "content": ""}, None)]
    frames += [chunk(d, None) for d in deltas]
    if finish is not None:
        frames.append(chunk({}, finish))
    frames.append(
        _openai_frame(
            {
                **head,
                "choices": [],
                "usage": usage or {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
            }
        )
    )
    if done:
        frames.append(b"data: [DONE]\n\n")
    return frames


def openai_text(pieces: Sequence[str], **kw: Any) -> list[bytes]:
    return openai_chunks([{"content": p} for p in pieces], **kw)


def openai_tool_calls(calls: Sequence[tuple[str, str, Sequence[str]]], **kw: Any) -> list[bytes]:
    """Calls as (id, name, argument pieces), streamed by index one after another."""
    deltas: list[Mapping[str, Any]] = []
    for index, (call_id, name, pieces) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function"}
        deltas.append({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]})
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in pieces]
    kw.setdefault("finish", "tool_calls")
    return openai_chunks(deltas, **kw)


def openai_error(
    status: int, message: str, *, type: str, code: str | None = None, **headers: str
) -> Reply:
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return Reply.error(status, body, **{"x-request-id": "req_fake", **headers})


# -- Anthropic Messages frames ------------------------------------------------------------------


def _anthropic_frame(event: Mapping[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def anthropic_events(
    blocks: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]],
    *,
    stop_reason: str | None = "end_turn",
    stop: bool = True,
    model: str = "fake-claude",
) -> list[bytes]:
    """Frames for content blocks given as (content_block, [deltas]), in order."""
    frames = [
        _anthropic_frame(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 25, "output_tokens": 1},
                },
            }
        ),
        _anthropic_frame({"type": "ping"}),
    ]
    for index, (block, deltas) in enumerate(blocks):
        frames.append(
            _anthropic_frame(
                {"type": "content_block_start", "index": index, "content_block": block}
            )
        )
        frames += [
            _anthropic_frame({"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        frames.append(_anthropic_frame({"type": "content_block_stop", "index": index}))
    if stop_reason is not None:
        frames.append(
            _anthropic_frame(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": 15},
                }
            )
        )
    if stop:
        frames.append(_anthropic_frame({"type": "message_stop"}))
    return frames


def anthropic_text(pieces: Sequence[str], **kw: Any) -> list[bytes]:
    deltas = [{"type": "text_delta", "text": p} for p in pieces]
    return anthropic_events([({"type": "text", "text": ""}, deltas)], **kw)


def anthropic_tool_calls(calls: Sequence[tuple[str, str, Sequence[str]]], **kw: Any) -> list[bytes]:
    blocks = [
        (
            {"type": "tool_use", "id": call_id, "name": name, "input": {}},
            [{"type": "input_json_delta", "partial_json": p} for p in pieces],
        )
        for call_id, name, pieces in calls
    ]
    kw.setdefault("stop_reason", "tool_use")
    return anthropic_events(blocks, **kw)


def anthropic_error(status: int, type: str, message: str, **headers: str) -> Reply:
    body = {"type": "error", "error": {"type": type, "message": message}, "request_id": "req_fake"}
    return Reply.error(status, body, **{"request-id": "req_fake", **headers})


def anthropic_stream_error(type: str, message: str) -> bytes:
    """The in-stream ``error`` event (after a 200 status)."""
    return _anthropic_frame({"type": "error", "error": {"type": type, "message": message}})


#: A web search result block as the Messages API streams it (whole, in its start event).
WEB_SEARCH_RESULT: Final[Mapping[str, Any]] = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [
        {
            "type": "web_search_result",
            "url": "https://example.com/a",
            "title": "Example A",
            "encrypted_content": "EqgfCioIARgBIiQ3",
            "page_age": "April 30, 2025",
        }
    ],
}


def anthropic_hosted(
    result: Mapping[str, Any] | None = WEB_SEARCH_RESULT, *, text: str = "Found it."
) -> list[bytes]:
    """A ``server_tool_use`` web search, then its result block (unless None), then text."""
    blocks: list[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]] = [
        ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Searching."}]),
        (
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            [
                {"type": "input_json_delta", "partial_json": '{"query": '},
                {"type": "input_json_delta", "partial_json": '"sessionrt"}'},
            ],
        ),
    ]
    if result is not None:
        blocks.append((result, []))
    blocks.append(({"type": "text", "text": ""}, [{"type": "text_delta", "text": text}]))
    return anthropic_events(blocks, stop_reason="end_turn")
