"""Shared helpers for the model layer's tests: building requests, draining streams.

Every test also checks the loop stays clean: a stream generator left
suspended would be finalised later by the loop, which is exactly the leak
a provider must not have.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from actors.llm import (
    SCRIPTED_MODEL,
    ChatMessage,
    ModelRequest,
    ProviderError,
    ScriptedProvider,
    StreamPart,
    TextContent,
)

MakeRequest = Callable[..., ModelRequest]
Collect = Callable[[ModelRequest], Awaitable[list[StreamPart]]]
CollectUntilError = Callable[[ModelRequest], Awaitable[tuple[list[StreamPart], ProviderError]]]


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene."""


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", parts=(TextContent(text=text),))


@pytest.fixture
def make_request() -> MakeRequest:
    """``make_request("a prompt", other_message, ..., tool_choice="none")``.

    Strings become user messages; keyword arguments are ModelRequest fields.
    """

    def make(*messages: ChatMessage | str, **fields: Any) -> ModelRequest:
        history = tuple(user(m) if isinstance(m, str) else m for m in messages)
        fields.setdefault("session_id", "ses_test")
        fields.setdefault("agent", "build")
        fields.setdefault("model", SCRIPTED_MODEL)
        return ModelRequest(messages=history, **fields)

    return make


@pytest.fixture
def collect() -> Collect:
    """Every part of a successful scripted stream."""

    async def run(request: ModelRequest) -> list[StreamPart]:
        return [part async for part in ScriptedProvider().stream(request)]

    return run


@pytest.fixture
def collect_until_error() -> CollectUntilError:
    """The parts streamed before the scripted stream raised, and the error."""

    async def run(request: ModelRequest) -> tuple[list[StreamPart], ProviderError]:
        parts: list[StreamPart] = []
        try:
            async for part in ScriptedProvider().stream(request):
                parts.append(part)
        except ProviderError as exc:
            return parts, exc
        raise AssertionError(f"the stream finished without raising: {parts[-1:]}")

    return run
