"""The request and stream values: what they accept and refuse."""

from __future__ import annotations

import pytest

from actors.llm import (
    SCRIPTED_MODEL,
    ChatMessage,
    ContentPart,
    FileContent,
    Finish,
    ModelRequest,
    ReasoningContent,
    TextContent,
    ToolCallContent,
    ToolResultContent,
    Usage,
)
from protocol.shapes import CacheTokens, Tokens

ALLOWED: dict[str, list[ContentPart]] = {
    "system": [TextContent(text="be brief")],
    "user": [TextContent(text="hi"), FileContent(mime="text/plain", data="aGk=", name="a.txt")],
    "assistant": [
        TextContent(text="ok"),
        ReasoningContent(text="hm"),
        ToolCallContent(id="c1", name="read", input={"path": "a"}),
    ],
    "tool": [ToolResultContent(id="c1", name="read", output="text", is_error=False)],
}
EVERY_PART = [part for parts in ALLOWED.values() for part in parts]


@pytest.mark.parametrize("role", list(ALLOWED))
def test_each_role_holds_only_its_parts(role: str) -> None:
    ChatMessage(role=role, parts=tuple(ALLOWED[role]))  # type: ignore[arg-type]
    allowed = {type(part) for part in ALLOWED[role]}
    for part in EVERY_PART:
        if type(part) not in allowed:
            with pytest.raises(ValueError, match=f"a {role} message cannot hold"):
                ChatMessage(role=role, parts=(part,))  # type: ignore[arg-type]


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="role"):
        ChatMessage(role="developer", parts=())  # type: ignore[arg-type]


def test_message_text_joins_the_text_parts_only() -> None:
    message = ChatMessage(
        role="assistant",
        parts=(TextContent(text="a"), ReasoningContent(text="hidden"), TextContent(text="b")),
    )

    assert message.text == "a\nb"


def test_a_request_has_neutral_defaults() -> None:
    request = ModelRequest(session_id="ses_1", agent="build", model=SCRIPTED_MODEL)

    assert (request.system, request.messages, request.tools) == ((), (), ())
    assert (request.tool_choice, request.max_steps_reached, request.metadata) == ("auto", False, {})


def test_a_request_refuses_an_unknown_tool_choice() -> None:
    with pytest.raises(ValueError, match="tool_choice"):
        ModelRequest(
            session_id="ses_1",
            agent="build",
            model=SCRIPTED_MODEL,
            tool_choice="required",  # type: ignore[arg-type]
        )


def test_a_finish_refuses_an_unknown_reason() -> None:
    with pytest.raises(ValueError, match="reason"):
        Finish(reason="done")  # type: ignore[arg-type]


def test_usage_converts_to_public_tokens() -> None:
    usage = Usage(input=10, output=5, reasoning=2, cache_read=3, cache_write=1, cost=0.5)

    assert usage.to_tokens() == Tokens(
        input=10, output=5, reasoning=2, cache=CacheTokens(read=3, write=1)
    )
    assert Finish(reason="stop").usage == Usage()
