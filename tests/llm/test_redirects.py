"""Provider requests never follow a redirect (issue 35, point 5).

aiohttp follows a 307 to another origin re-sending custom headers: the
Anthropic adapter's ``x-api-key`` and the prompt reached the other port on
every request. Here the provider's server answers each request with a
redirect to a second local server that would answer it well; the request
must fail as a provider error and nothing may reach the second server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from llm.fake_providers import FakeProvider, Reply, anthropic_text, openai_text

from actors.llm import (
    AnthropicProvider,
    ChatMessage,
    ModelLimits,
    ModelRequest,
    OpenAIProvider,
    ProviderConfig,
    ProviderError,
    TextContent,
)
from protocol.shapes import ModelRef

KEY = "sk-0123456789abcdefREDIRECTED"


@pytest.fixture
async def servers() -> AsyncIterator[tuple[FakeProvider, FakeProvider]]:
    async with FakeProvider() as origin, FakeProvider() as elsewhere:
        yield origin, elsewhere


def _request(provider_id: str) -> ModelRequest:
    return ModelRequest(
        session_id="ses_test",
        agent="build",
        model=ModelRef(id="m", provider_id=provider_id),
        messages=(ChatMessage(role="user", parts=(TextContent(text="the prompt"),)),),
    )


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_redirect_is_a_provider_error_and_the_key_stays_home(
    servers: tuple[FakeProvider, FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    status: int,
) -> None:
    origin, elsewhere = servers
    monkeypatch.setenv("REDIRECT_TEST_KEY", KEY)
    if kind == "anthropic":
        target, base = f"{elsewhere.root}/v1/messages", origin.anthropic_url
        elsewhere.replies.append(Reply.stream(anthropic_text(["stolen"])))
    else:
        target, base = f"{elsewhere.openai_url}/chat/completions", origin.openai_url
        elsewhere.replies.append(Reply.stream(openai_text(["stolen"])))
    origin.replies.append(Reply(status=status, headers={"location": target}, body=b"{}"))
    config = ProviderConfig(
        id="p",
        kind=kind,  # type: ignore[arg-type]
        base_url=base,
        api_key_env="REDIRECT_TEST_KEY",
        models={"m": ModelLimits(context=1000, output=100)},
    )
    adapter = AnthropicProvider(config) if kind == "anthropic" else OpenAIProvider(config)
    try:
        with pytest.raises(ProviderError) as caught:
            async for _ in adapter.stream(_request("p")):
                pass
    finally:
        await adapter.aclose()
    assert f"HTTP {status}" in str(caught.value)
    assert KEY not in str(caught.value)
    assert len(origin.received) == 1
    assert KEY in str(origin.received[0].headers)  # it was sent where configured
    assert elsewhere.received == []  # and nowhere else
