"""Hosted (provider-executed) calls on the real Anthropic wire format, served locally."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
from llm.fake_providers import WEB_SEARCH_RESULT, FakeProvider, Reply, anthropic_hosted

from actors.llm import (
    AnthropicProvider,
    ChatMessage,
    HostedContent,
    HostedResult,
    ModelLimits,
    ModelRequest,
    ProviderConfig,
    StreamPart,
    TextContent,
    ToolCall,
    ToolInputChunk,
    ToolInputStart,
)
from protocol.shapes import ModelRef

MODEL = ModelRef(id="fake-claude", provider_id="claude")


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


@pytest.fixture
async def provider(fake: FakeProvider) -> AsyncIterator[AnthropicProvider]:
    config = ProviderConfig(
        id="claude",
        kind="anthropic",
        base_url=fake.anthropic_url,
        models={"fake-claude": ModelLimits(context=200_000, output=1024)},
    )
    p = AnthropicProvider(config)
    try:
        yield p
    finally:
        await p.aclose()


async def collect(provider: AnthropicProvider, request: ModelRequest) -> list[StreamPart]:
    return [part async for part in provider.stream(request)]


def request(*messages: ChatMessage, model: ModelRef = MODEL) -> ModelRequest:
    history = (ChatMessage(role="user", parts=(TextContent(text="search"),)), *messages)
    return ModelRequest(session_id="ses_1", agent="build", model=model, messages=history)


async def test_server_tool_use_is_a_hosted_call_and_its_result_follows(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    fake.replies.append(Reply.stream(anthropic_hosted()))
    parts = await collect(provider, request())
    assert ToolInputStart(id="srvtoolu_1", name="web_search") in parts
    assert ToolInputChunk(id="srvtoolu_1", delta='{"query": ') in parts
    call = next(p for p in parts if isinstance(p, ToolCall))
    assert call == ToolCall(
        id="srvtoolu_1", name="web_search", input={"query": "sessionrt"}, hosted=True
    )
    result = next(p for p in parts if isinstance(p, HostedResult))
    assert result == HostedResult(id="srvtoolu_1", content=WEB_SEARCH_RESULT, error=False)
    assert parts.index(call) < parts.index(result)


async def test_an_error_result_is_flagged(fake: FakeProvider, provider: AnthropicProvider) -> None:
    error = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
    }
    fake.replies.append(Reply.stream(anthropic_hosted(error)))
    parts = await collect(provider, request())
    (result,) = [p for p in parts if isinstance(p, HostedResult)]
    assert result.error
    assert result.content == error


async def test_a_hosted_call_replays_natively_to_its_model_and_as_text_elsewhere(
    fake: FakeProvider, provider: AnthropicProvider
) -> None:
    hosted = HostedContent(
        id="srvtoolu_1",
        name="web_search",
        input={"query": "sessionrt"},
        result=WEB_SEARCH_RESULT,
        text="[web_search: found]",
    )
    earlier = ChatMessage(role="assistant", parts=(hosted, TextContent(text="Done.")), model=MODEL)
    fake.replies.append(Reply.stream(anthropic_hosted(text="again")))
    await collect(provider, request(earlier))
    assistant = fake.received[-1].body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"query": "sessionrt"},
        },
        dict(WEB_SEARCH_RESULT),
        {"type": "text", "text": "Done."},
    ]

    # Another model never gets the provider's blocks: plain text instead.
    other = ModelRef(id="other-claude", provider_id="claude")
    fake.replies.append(Reply.stream(anthropic_hosted(text="again")))
    await collect(provider, request(earlier, model=other))
    assert fake.received[-1].body["messages"][1]["content"] == [
        {"type": "text", "text": "[web_search: found]"},
        {"type": "text", "text": "Done."},
    ]

    # Without a result a server_tool_use cannot go back natively either.
    unanswered = ChatMessage(
        role="assistant", parts=(attrs.evolve(hosted, result=None),), model=MODEL
    )
    fake.replies.append(Reply.stream(anthropic_hosted(text="again")))
    await collect(provider, request(unanswered))
    assert fake.received[-1].body["messages"][1]["content"] == [
        {"type": "text", "text": "[web_search: found]"}
    ]
