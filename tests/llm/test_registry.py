"""Resolving a model to the provider that serves it."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest

from actors.llm import (
    SCRIPTED_MODEL,
    Finish,
    ModelRequest,
    NoRouteError,
    Provider,
    ProviderRegistry,
    ScriptedProvider,
    StreamPart,
)
from protocol.shapes import ModelRef


class EchoProvider:
    """A stand-in adapter: any async generator method satisfies the protocol."""

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        yield Finish(reason="stop")


def test_without_a_model_the_scripted_provider_answers() -> None:
    registry = ProviderRegistry()

    assert isinstance(registry.resolve(None), ScriptedProvider)
    assert registry.resolve(None) is registry.resolve(SCRIPTED_MODEL)


def test_the_scripted_provider_id_always_resolves() -> None:
    provider = ProviderRegistry().resolve(ModelRef(id="anything", provider_id="scripted"))

    assert isinstance(provider, ScriptedProvider)


def test_a_configured_provider_serves_its_models() -> None:
    echo: Provider = EchoProvider()
    registry = ProviderRegistry(providers={"openai": echo})

    assert registry.resolve(ModelRef(id="gpt-x", provider_id="openai")) is echo
    assert isinstance(registry.resolve(None), ScriptedProvider)


def test_configuration_may_replace_the_scripted_and_default_providers() -> None:
    echo, other = EchoProvider(), EchoProvider()
    registry = ProviderRegistry(providers={"scripted": echo}, default=other)

    assert registry.resolve(SCRIPTED_MODEL) is echo
    assert registry.resolve(None) is other


def test_an_unconfigured_provider_is_no_route() -> None:
    registry = ProviderRegistry(providers={"openai": EchoProvider()})

    with pytest.raises(NoRouteError, match="'anthropic'") as caught:
        registry.resolve(ModelRef(id="claude", provider_id="anthropic"))
    assert not caught.value.retryable


def test_the_registry_keeps_its_own_copy_of_the_providers() -> None:
    providers: dict[str, Provider] = {}
    registry = ProviderRegistry(providers=providers)
    providers["openai"] = EchoProvider()

    with pytest.raises(NoRouteError):
        registry.resolve(ModelRef(id="gpt-x", provider_id="openai"))
