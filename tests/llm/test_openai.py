"""The OpenAI-compatible adapter against a real loopback server speaking the format."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from llm.fake_providers import FakeProvider, Reply, openai_chunks, openai_error, openai_text
from llm.fake_providers import openai_tool_calls as tool_calls

from actors.llm import (
    AuthenticationError,
    ChatMessage,
    ContentPolicyError,
    ContextOverflowError,
    Finish,
    IncompleteStreamError,
    ModelLimits,
    ModelRequest,
    OpenAIProvider,
    ProviderConfig,
    ProviderError,
    ProviderInternalError,
    ProviderInvalidRequestError,
    QuotaExceededError,
    RateLimitError,
    ReasoningChunk,
    ReasoningContent,
    ReasoningEnd,
    ReasoningStart,
    StreamPart,
    TextChunk,
    TextContent,
    TextEnd,
    TextStart,
    ToolCall,
    ToolCallContent,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
    ToolResultContent,
    ToolSpec,
    TransportError,
    Usage,
)
from actors.llm._http import HttpTransport
from protocol.shapes import ModelRef

KEY = "sk-test-0123456789abcdefSECRET"
MODEL = ModelRef(id="fake-model", provider_id="local")


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


@pytest.fixture
async def provider(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[OpenAIProvider]:
    monkeypatch.setenv("LOCAL_API_KEY", KEY)
    config = ProviderConfig(
        id="local",
        kind="openai",
        base_url=fake.openai_url,
        api_key_env="LOCAL_API_KEY",
        headers={"x-extra": "1"},
        models={"fake-model": ModelLimits(context=128_000, output=4096)},
    )
    adapter = OpenAIProvider(config, HttpTransport(config, idle_read_timeout_s=0.5))
    yield adapter
    await adapter.aclose()


def request(*messages: ChatMessage | str, **fields: Any) -> ModelRequest:
    history = tuple(
        ChatMessage(role="user", parts=(TextContent(text=m),)) if isinstance(m, str) else m
        for m in messages
    )
    fields.setdefault("model", MODEL)
    return ModelRequest(session_id="ses_test", agent="build", messages=history, **fields)


async def collect(provider: OpenAIProvider, req: ModelRequest) -> list[StreamPart]:
    return [part async for part in provider.stream(req)]


async def failure(provider: OpenAIProvider, req: ModelRequest) -> tuple[list[StreamPart], Any]:
    parts: list[StreamPart] = []
    try:
        async for part in provider.stream(req):
            parts.append(part)
    except ProviderError as exc:
        return parts, exc
    raise AssertionError(f"the stream finished: {parts[-1:]}")


async def test_a_plain_answer_streams_text_usage_and_the_request_is_well_formed(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 7,
        "total_tokens": 37,
        "prompt_tokens_details": {"cached_tokens": 10},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    fake.replies.append(Reply.stream(openai_text(["Hel", "lo"], usage=usage)))

    parts = await collect(provider, request("hi", system=("Be brief.",)))

    assert parts == [
        TextStart(ordinal=0),
        TextChunk(ordinal=0, delta="Hel"),
        TextChunk(ordinal=0, delta="lo"),
        TextEnd(ordinal=0),
        Finish(reason="stop", usage=Usage(input=20, output=7, reasoning=2, cache_read=10)),
    ]
    sent = fake.received[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert sent.headers["x-extra"] == "1"
    assert sent.body == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 4096,
    }


async def test_tool_calls_stream_by_index_and_history_goes_back_in_order(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(
        Reply.stream(
            tool_calls([("call_a", "read", ['{"pa', 'th": "x"}']), ("call_b", "ls", ["{}"])])
        )
    )
    tools = (ToolSpec(name="read", description="Read", input_schema={"type": "object"}),)
    parts = await collect(provider, request("go", tools=tools, tool_choice="none"))

    assert parts == [
        ToolInputStart(id="call_a", name="read"),
        ToolInputChunk(id="call_a", delta='{"pa'),
        ToolInputChunk(id="call_a", delta='th": "x"}'),
        ToolInputEnd(id="call_a"),
        ToolCall(id="call_a", name="read", input={"path": "x"}),
        ToolInputStart(id="call_b", name="ls"),
        ToolInputChunk(id="call_b", delta="{}"),
        ToolInputEnd(id="call_b"),
        ToolCall(id="call_b", name="ls", input={}),
        Finish(reason="tool-calls", usage=Usage(input=12, output=5)),
    ]
    assert fake.received[0].body["tools"] == [
        {
            "type": "function",
            "function": {"name": "read", "description": "Read", "parameters": {"type": "object"}},
        }
    ]
    assert fake.received[0].body["tool_choice"] == "none"

    # The next step's history: the calls, their results as role=tool right after.
    fake.replies.append(Reply.stream(openai_text(["done"])))
    history = (
        "go",
        ChatMessage(
            role="assistant",
            parts=(
                ReasoningContent(text="thinking"),
                TextContent(text="Reading."),
                ToolCallContent(id="call_a", name="read", input={"path": "x"}),
                ToolCallContent(id="call_b", name="ls", input={}),
            ),
            model=MODEL,
        ),
        ChatMessage(
            role="tool",
            parts=(
                ToolResultContent(id="call_a", name="read", output="contents"),
                ToolResultContent(id="call_b", name="ls", output="boom", is_error=True),
            ),
        ),
        ChatMessage(role="system", parts=(TextContent(text="note"),)),
    )
    await collect(provider, request(*history))
    assert fake.received[1].body["messages"] == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"x"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "contents"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Error: boom"},
        {"role": "system", "content": "note"},
    ]


async def test_reasoning_deltas_become_a_reasoning_block_before_the_text(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(
        Reply.stream(
            openai_chunks(
                [{"reasoning_content": "let me "}, {"reasoning": "think"}, {"content": "42"}]
            )
        )
    )
    parts = await collect(provider, request("q"))
    assert parts[:6] == [
        ReasoningStart(ordinal=0),
        ReasoningChunk(ordinal=0, delta="let me "),
        ReasoningChunk(ordinal=0, delta="think"),
        ReasoningEnd(ordinal=0),
        TextStart(ordinal=1),
        TextChunk(ordinal=1, delta="42"),
    ]


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", "length"), ("content_filter", "content-filter"), ("weird", "other")],
)
async def test_finish_reasons(
    fake: FakeProvider, provider: OpenAIProvider, finish: str, reason: str
) -> None:
    fake.replies.append(Reply.stream(openai_text(["x"], finish=finish)))
    parts = await collect(provider, request("q"))
    assert isinstance(parts[-1], Finish)
    assert parts[-1].reason == reason


async def test_rate_limit_parses_retry_after_in_seconds_and_ms(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(openai_error(429, "slow down", type="requests", **{"retry-after": "7"}))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, RateLimitError)
    assert error.retry_after_ms == 7000
    assert error.retryable

    fake.replies.append(
        openai_error(429, "slow", type="requests", **{"retry-after-ms": "1500", "retry-after": "9"})
    )
    _, error = await failure(provider, request("q"))
    assert isinstance(error, RateLimitError)
    assert error.retry_after_ms == 1500


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_provider_internal(
    fake: FakeProvider, provider: OpenAIProvider, status: int
) -> None:
    fake.replies.append(openai_error(status, "oops", type="server_error"))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)
    assert error.retryable


@pytest.mark.parametrize(
    ("reply", "kind", "retryable"),
    [
        (
            openai_error(
                400,
                "This model's maximum context length is 8192 tokens.",
                type="invalid_request_error",
                code="context_length_exceeded",
            ),
            ContextOverflowError,
            False,
        ),
        (openai_error(401, "bad key", type="invalid_request_error"), AuthenticationError, False),
        (openai_error(403, "forbidden", type="permission"), AuthenticationError, False),
        (
            openai_error(429, "quota", type="insufficient_quota", code="insufficient_quota"),
            QuotaExceededError,
            False,
        ),
        (
            openai_error(404, "no model", type="invalid_request_error"),
            ProviderInvalidRequestError,
            False,
        ),
        (
            openai_error(400, "flagged", type="invalid_request_error", code="content_filter"),
            ContentPolicyError,
            False,
        ),
    ],
)
async def test_status_classification(
    fake: FakeProvider, provider: OpenAIProvider, reply: Reply, kind: type, retryable: bool
) -> None:
    fake.replies.append(reply)
    _, error = await failure(provider, request("q"))
    assert type(error) is kind
    assert error.retryable is retryable


async def test_x_should_retry_stops_a_retry_but_never_starts_one(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(
        openai_error(503, "down", type="server_error", **{"x-should-retry": "false"})
    )
    _, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)
    assert not error.retryable
    fake.replies.append(
        openai_error(400, "odd", type="invalid_request_error", **{"x-should-retry": "true"})
    )
    _, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInvalidRequestError)
    assert error.should_retry_override is True
    assert not error.retryable


async def test_a_stream_cut_before_output_is_incomplete_without_output(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply.stream(openai_text(["a", "b"]), cut_after=1))
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert error.retryable
    assert parts == []
    assert "before any output" in error.message


async def test_a_stream_reset_after_output_is_incomplete_after_output(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply.stream(openai_text(["a", "b"]), reset_after=3))
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert parts == [
        TextStart(ordinal=0),
        TextChunk(ordinal=0, delta="a"),
        TextChunk(ordinal=0, delta="b"),
    ]
    assert "after output was produced" in error.message


async def test_done_without_a_finish_reason_is_incomplete(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply.stream(openai_text(["a"], finish=None)))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)


async def test_a_stalled_stream_times_out_as_incomplete(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply.stream(openai_text(["a"])[:2], hang=True))
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert parts[-1] == TextChunk(ordinal=0, delta="a")


async def test_a_reset_before_the_answer_is_transport_with_unknown_delivery(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply(reset_after=0))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, TransportError)
    assert error.delivery == "unknown"


async def test_no_answer_within_the_idle_timeout_is_transport_with_unknown_delivery(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply(stall=True))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, TransportError)
    assert error.delivery == "unknown"


async def test_connection_refused_is_transport_not_sent(
    unused_tcp_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_API_KEY", KEY)
    config = ProviderConfig(
        id="local",
        kind="openai",
        base_url=f"http://127.0.0.1:{unused_tcp_port}/v1",
        api_key_env="LOCAL_API_KEY",
    )
    adapter = OpenAIProvider(config)
    try:
        _, error = await failure(adapter, request("q"))
    finally:
        await adapter.aclose()
    assert isinstance(error, TransportError)
    assert error.delivery == "not-sent"
    assert error.retryable
    assert "127.0.0.1" not in error.message
    assert str(unused_tcp_port) not in error.message


async def test_an_in_stream_error_object_is_classified(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    error_frame = b'data: {"error": {"message": "overloaded", "type": "x", "code": 529}}\n\n'
    fake.replies.append(Reply.stream([*openai_text(["a"])[:2], error_frame]))
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)
    assert parts == [TextStart(ordinal=0), TextChunk(ordinal=0, delta="a")]
    error_frame = b'data: {"error": {"message": "slow", "type": "server_error"}}\n\n'
    fake.replies.append(Reply.stream([error_frame]))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)


async def test_a_missing_key_variable_is_named(
    fake: FakeProvider, provider: OpenAIProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_API_KEY")
    _, error = await failure(provider, request("q"))
    assert isinstance(error, AuthenticationError)
    assert not error.retryable
    assert "LOCAL_API_KEY" in error.message
    assert fake.received == []  # nothing was sent without the key


async def test_a_json_completion_to_a_stream_request_is_read_as_the_answer(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "reasoning_content": "hmm",
                    "content": "Reading.",
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"path": "x"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
    }
    fake.replies.append(Reply(body=orjson.dumps(completion)))
    parts = await collect(provider, request("q"))
    assert fake.received[0].body["stream"] is True
    assert parts == [
        ReasoningStart(ordinal=0),
        ReasoningChunk(ordinal=0, delta="hmm"),
        ReasoningEnd(ordinal=0),
        TextStart(ordinal=1),
        TextChunk(ordinal=1, delta="Reading."),
        TextEnd(ordinal=1),
        ToolInputStart(id="call_a", name="read"),
        ToolInputChunk(id="call_a", delta='{"path": "x"}'),
        ToolInputEnd(id="call_a"),
        ToolCall(id="call_a", name="read", input={"path": "x"}),
        Finish(reason="tool-calls", usage=Usage(input=12, output=5)),
    ]


async def test_a_json_answer_that_is_no_completion_names_its_content_type(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    fake.replies.append(Reply(body=orjson.dumps({"error": {"message": "x", "code": 429}})))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, RateLimitError)
    fake.replies.append(Reply(body=b"[1, 2]"))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert "application/json" in error.message
    fake.replies.append(Reply(body=b"not json at all"))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert "application/json" in error.message


async def test_the_key_and_host_never_appear_in_errors_or_logs(
    fake: FakeProvider, provider: OpenAIProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    masked = KEY[:6] + "*" * 10 + KEY[-4:]
    messages: list[str] = []
    for reply in (
        openai_error(401, f"Incorrect API key provided: {masked}.", type="invalid_request_error"),
        openai_error(400, f"key {KEY} at {fake.root} refused", type="invalid_request_error"),
    ):
        fake.replies.append(reply)
        _, error = await failure(provider, request("q"))
        messages.append(error.message)
        messages.append(str(error))
    texts = "\n".join(messages) + caplog.text
    assert "refused" in texts  # the provider's own words are kept...
    for secret in (KEY, KEY[:6], KEY[-4:], masked, fake.root, f":{fake.port}"):
        assert secret not in texts  # ...without the key or the address


async def test_the_connection_is_reused_from_one_call_to_the_next(
    fake: FakeProvider, provider: OpenAIProvider
) -> None:
    for text in ("one", "two", "three"):
        # The body ends a moment after the last event: a client that stops
        # reading at the finish leaves it unread and loses the connection.
        reply = Reply.stream(openai_text([text]), tail=b": end\n\n", tail_delay_s=0.05)
        fake.replies.append(reply)
        parts = await collect(provider, request("q"))
        assert isinstance(parts[-1], Finish)
    assert len({r.peer for r in fake.received}) == 1
