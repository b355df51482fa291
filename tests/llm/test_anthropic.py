"""The Anthropic Messages adapter against a real loopback server speaking the format."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from llm.fake_providers import (
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_events,
    anthropic_stream_error,
    anthropic_text,
    anthropic_tool_calls,
)

from actors.llm import (
    AnthropicProvider,
    AuthenticationError,
    ChatMessage,
    ContextOverflowError,
    Finish,
    IncompleteStreamError,
    ModelLimits,
    ModelRequest,
    ProviderConfig,
    ProviderError,
    ProviderInternalError,
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
    Usage,
)
from protocol.shapes import ModelRef

KEY = "sk-ant-api03-0123456789abcdefSECRET"
MODEL = ModelRef(id="fake-claude", provider_id="claude")


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


@pytest.fixture
async def provider(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AnthropicProvider]:
    monkeypatch.setenv("CLAUDE_KEY", KEY)
    config = ProviderConfig(
        id="claude",
        kind="anthropic",
        base_url=fake.anthropic_url,
        api_key_env="CLAUDE_KEY",
        models={"fake-claude": ModelLimits(context=200_000, output=8192)},
    )
    adapter = AnthropicProvider(config)
    yield adapter
    await adapter.aclose()


def request(*messages: ChatMessage | str, **fields: Any) -> ModelRequest:
    history = tuple(
        ChatMessage(role="user", parts=(TextContent(text=m),)) if isinstance(m, str) else m
        for m in messages
    )
    fields.setdefault("model", MODEL)
    return ModelRequest(session_id="ses_test", agent="build", messages=history, **fields)


async def collect(provider: AnthropicProvider, req: ModelRequest) -> list[StreamPart]:
    return [part async for part in provider.stream(req)]


async def failure(provider: AnthropicProvider, req: ModelRequest) -> tuple[list[StreamPart], Any]:
    parts: list[StreamPart] = []
    try:
        async for part in provider.stream(req):
            parts.append(part)
    except ProviderError as exc:
        return parts, exc
    raise AssertionError(f"the stream finished: {parts[-1:]}")


async def test_a_plain_answer_and_the_request_shape(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(Reply.stream(anthropic_text(["Hel", "lo"])))

    parts = await collect(provider, request("hi", system=("Be brief.",)))

    assert parts == [
        TextStart(ordinal=0),
        TextChunk(ordinal=0, delta="Hel"),
        TextChunk(ordinal=0, delta="lo"),
        TextEnd(ordinal=0),
        Finish(reason="stop", usage=Usage(input=25, output=15)),
    ]
    sent = fake.received[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in sent.headers
    assert sent.body == {
        "model": "fake-claude",
        "max_tokens": 8192,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True,
        "system": "Be brief.",
    }


async def test_tool_use_and_the_results_in_the_next_user_message(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(
        Reply.stream(
            anthropic_tool_calls(
                [("toolu_1", "read", ['{"path":', ' "x"}']), ("toolu_2", "ls", [])]
            )
        )
    )
    tools = (ToolSpec(name="read", description="Read", input_schema={"type": "object"}),)
    parts = await collect(provider, request("go", tools=tools))
    assert parts == [
        ToolInputStart(id="toolu_1", name="read"),
        ToolInputChunk(id="toolu_1", delta='{"path":'),
        ToolInputChunk(id="toolu_1", delta=' "x"}'),
        ToolInputEnd(id="toolu_1"),
        ToolCall(id="toolu_1", name="read", input={"path": "x"}),
        ToolInputStart(id="toolu_2", name="ls"),
        ToolInputEnd(id="toolu_2"),
        ToolCall(id="toolu_2", name="ls", input={}),
        Finish(reason="tool-calls", usage=Usage(input=25, output=15)),
    ]
    assert fake.received[0].body["tools"] == [
        {"name": "read", "description": "Read", "input_schema": {"type": "object"}}
    ]
    assert fake.received[0].body["tool_choice"] == {"type": "auto"}

    fake.replies.append(Reply.stream(anthropic_text(["ok"])))
    other = ModelRef(id="other", provider_id="claude")
    history = (
        "go",
        ChatMessage(
            role="assistant",
            parts=(
                ReasoningContent(text="hmm", signature="sig-1"),
                TextContent(text="Reading."),
                ToolCallContent(id="toolu_1", name="read", input={"path": "x"}),
                ToolCallContent(id="toolu_2", name="ls", input={}),
            ),
            model=MODEL,
        ),
        ChatMessage(
            role="tool",
            parts=(
                ToolResultContent(id="toolu_1", name="read", output="contents"),
                ToolResultContent(id="toolu_2", name="ls", output="boom", is_error=True),
            ),
        ),
        "and then",
        ChatMessage(
            role="assistant",
            parts=(ReasoningContent(text="other model", signature="sig-2"), TextContent(text="B")),
            model=other,
        ),
        ChatMessage(role="system", parts=(TextContent(text="note"),)),
    )
    await collect(provider, request(*history))
    assert fake.received[1].body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig-1"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "x"}},
                {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "contents"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "boom",
                    "is_error": True,
                },
                {"type": "text", "text": "and then"},
            ],
        },
        # Reasoning of another model is not replayed.
        {"role": "assistant", "content": [{"type": "text", "text": "B"}]},
        {"role": "user", "content": [{"type": "text", "text": "note"}]},
    ]


async def test_thinking_streams_as_reasoning_with_its_signature(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(
        Reply.stream(
            anthropic_events(
                [
                    (
                        {"type": "thinking", "thinking": ""},
                        [
                            {"type": "thinking_delta", "thinking": "let me "},
                            {"type": "thinking_delta", "thinking": "think"},
                            {"type": "signature_delta", "signature": "EqQBCgIYAh"},
                        ],
                    ),
                    ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "42"}]),
                ]
            )
        )
    )
    parts = await collect(provider, request("q"))
    assert parts[:6] == [
        ReasoningStart(ordinal=0),
        ReasoningChunk(ordinal=0, delta="let me "),
        ReasoningChunk(ordinal=0, delta="think"),
        ReasoningEnd(ordinal=0, signature="EqQBCgIYAh"),
        TextStart(ordinal=1),
        TextChunk(ordinal=1, delta="42"),
    ]


@pytest.mark.parametrize(
    ("stop", "reason"),
    [("max_tokens", "length"), ("refusal", "content-filter"), ("stop_sequence", "stop")],
)
async def test_stop_reasons(
    fake: FakeProvider, provider: AnthropicProvider, stop: str, reason: str
) -> None:
    fake.replies.append(Reply.stream(anthropic_text(["x"], stop_reason=stop)))
    parts = await collect(provider, request("q"))
    assert parts[-1] == Finish(reason=reason, usage=Usage(input=25, output=15))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reply", "kind", "retryable"),
    [
        (anthropic_error(529, "overloaded_error", "Overloaded"), ProviderInternalError, True),
        (anthropic_error(500, "api_error", "Internal"), ProviderInternalError, True),
        (
            anthropic_error(400, "invalid_request_error", "prompt is too long: 210000 > 200000"),
            ContextOverflowError,
            False,
        ),
        (
            anthropic_error(401, "authentication_error", "invalid x-api-key"),
            AuthenticationError,
            False,
        ),
        (anthropic_error(403, "permission_error", "no"), AuthenticationError, False),
        (anthropic_error(402, "billing_error", "credit balance"), QuotaExceededError, False),
        (
            anthropic_error(
                400, "invalid_request_error", "Your credit balance is too low to access the API."
            ),
            QuotaExceededError,
            False,
        ),
    ],
)
async def test_error_classification(
    fake: FakeProvider, provider: AnthropicProvider, reply: Reply, kind: type, retryable: bool
) -> None:
    fake.replies.append(reply)
    _, error = await failure(provider, request("q"))
    assert type(error) is kind
    assert error.retryable is retryable


async def test_rate_limit_with_retry_after_and_the_override(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(anthropic_error(429, "rate_limit_error", "slow", **{"retry-after": "3"}))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, RateLimitError)
    assert error.retry_after_ms == 3000
    fake.replies.append(
        anthropic_error(529, "overloaded_error", "busy", **{"x-should-retry": "false"})
    )
    _, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)
    assert not error.retryable


async def test_x_should_retry_true_does_not_make_a_401_retryable(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(
        anthropic_error(401, "authentication_error", "bad key", **{"x-should-retry": "true"})
    )
    _, error = await failure(provider, request("q"))
    assert isinstance(error, AuthenticationError)
    assert error.should_retry_override is True
    assert not error.retryable


async def test_an_in_stream_overloaded_error_after_output(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    frames = anthropic_text(["a"])
    fake.replies.append(
        Reply.stream([*frames[:4], anthropic_stream_error("overloaded_error", "Overloaded")])
    )
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)
    assert parts == [TextStart(ordinal=0), TextChunk(ordinal=0, delta="a")]


async def test_a_stream_without_message_stop_is_incomplete(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(Reply.stream(anthropic_text(["a"], stop=False)))
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert "after output was produced" in error.message
    assert parts[-1] == TextEnd(ordinal=0)

    fake.replies.append(Reply.stream(anthropic_text(["a"]), reset_after=2))
    parts, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert "before any output" in error.message
    assert parts == []


def _message(content: list[dict[str, Any]], stop: str | None = "end_turn") -> bytes:
    """A whole Messages response, as a gateway answers a stream request for a mock model."""
    return orjson.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "fake-claude",
            "content": content,
            "stop_reason": stop,
            "usage": {"input_tokens": 9, "output_tokens": 4},
        }
    )


async def test_a_json_answer_to_a_stream_request_is_read_as_the_message(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(
        Reply(
            body=_message(
                [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "x"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {}},
                ],
                stop="tool_use",
            )
        )
    )
    parts = await collect(provider, request("go"))
    assert fake.received[0].body["stream"] is True
    assert parts == [
        ReasoningStart(ordinal=0),
        ReasoningChunk(ordinal=0, delta="hmm"),
        ReasoningEnd(ordinal=0, signature="sig"),
        TextStart(ordinal=1),
        TextChunk(ordinal=1, delta="Reading."),
        TextEnd(ordinal=1),
        ToolInputStart(id="toolu_1", name="read"),
        ToolInputChunk(id="toolu_1", delta='{"path":"x"}'),
        ToolInputEnd(id="toolu_1"),
        ToolCall(id="toolu_1", name="read", input={"path": "x"}),
        ToolInputStart(id="toolu_2", name="ls"),
        ToolInputEnd(id="toolu_2"),
        ToolCall(id="toolu_2", name="ls", input={}),
        Finish(reason="tool-calls", usage=Usage(input=9, output=4)),
    ]
    # The connection is still good for the next (streamed) call.
    fake.replies.append(Reply.stream(anthropic_text(["ok"])))
    assert isinstance((await collect(provider, request("q")))[-1], Finish)


async def test_a_json_error_or_non_message_answer_says_what_came(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(
        Reply(
            body=orjson.dumps(
                {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
            )
        )
    )
    _, error = await failure(provider, request("q"))
    assert isinstance(error, ProviderInternalError)
    fake.replies.append(Reply(body=b'{"hello": "world"}'))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert "application/json" in error.message
    assert "before any output" in error.message
    fake.replies.append(Reply(body=b"<html>gateway</html>", headers={"content-type": "text/html"}))
    _, error = await failure(provider, request("q"))
    assert isinstance(error, IncompleteStreamError)
    assert "text/html" in error.message


async def test_the_key_never_appears_in_errors_or_logs(
    fake: FakeProvider, provider: AnthropicProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.replies.append(anthropic_error(401, "authentication_error", f"bad key {KEY} here"))
    _, error = await failure(provider, request("q"))
    texts = f"{error.message}\n{error!s}\n{error!r}\n{caplog.text}"
    assert "bad key" in texts
    assert KEY not in texts
    assert KEY[-4:] not in texts


async def test_the_connection_is_reused_from_one_call_to_the_next(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    for text in ("one", "two", "three"):
        # The body ends a moment after the last event: a client that stops
        # reading at the finish leaves it unread and loses the connection.
        reply = Reply.stream(anthropic_text([text]), tail=b": end\n\n", tail_delay_s=0.05)
        fake.replies.append(reply)
        parts = await collect(provider, request("q"))
        assert isinstance(parts[-1], Finish)
    assert len({r.peer for r in fake.received}) == 1
