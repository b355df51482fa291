"""The max-steps directive and how the scripted provider answers it (reference §4.5)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from actors.llm import (
    MAX_STEPS_MESSAGE,
    MAX_STEPS_TEXT,
    ChatMessage,
    Finish,
    ModelRequest,
    StreamPart,
    TextChunk,
    TextContent,
    ToolCall,
    ToolSpec,
    is_max_steps_message,
    with_max_steps,
)

MakeRequest = Callable[..., ModelRequest]
Collect = Callable[[ModelRequest], Awaitable[list[StreamPart]]]

TOOLS = (ToolSpec(name="read", description="Read a file", input_schema={"type": "object"}),)


def test_the_directive_is_an_assistant_message_with_both_marker_phrases() -> None:
    assert MAX_STEPS_MESSAGE.role == "assistant"
    assert MAX_STEPS_MESSAGE.text == MAX_STEPS_TEXT
    assert "MAXIMUM STEPS REACHED" in MAX_STEPS_TEXT
    assert "maximum number of steps allowed" in MAX_STEPS_TEXT


def test_with_max_steps_appends_the_directive_and_forbids_tool_calls(
    make_request: MakeRequest,
) -> None:
    request = make_request("go", tools=TOOLS)
    limited = with_max_steps(request)

    assert limited.messages == (*request.messages, MAX_STEPS_MESSAGE)
    assert (limited.tool_choice, limited.max_steps_reached) == ("none", True)
    assert limited.tools == TOOLS  # kept, so a prompt cache still matches
    assert (request.tool_choice, request.max_steps_reached) == ("auto", False)


def test_with_max_steps_is_idempotent(make_request: MakeRequest) -> None:
    once = with_max_steps(make_request("go"))

    assert with_max_steps(once) == once


def test_only_the_directive_itself_is_recognised() -> None:
    lookalike = ChatMessage(role="assistant", parts=(TextContent(text="MAXIMUM STEPS REACHED"),))

    assert is_max_steps_message(MAX_STEPS_MESSAGE)
    assert not is_max_steps_message(lookalike)


async def test_the_scripted_provider_answers_the_same_step_without_tools(
    make_request: MakeRequest, collect: Collect
) -> None:
    script = "#tool read {}\n---\n#text Summary so far.\n#tool read {}"
    turn = ChatMessage(role="assistant", parts=(TextContent(text="reading"),))
    parts = await collect(with_max_steps(make_request(script, turn, tools=TOOLS)))

    # The directive is not an answer: this is still step 1, with its tool dropped.
    assert "".join(p.delta for p in parts if isinstance(p, TextChunk)) == "Summary so far."
    assert not any(isinstance(p, ToolCall) for p in parts)
    assert isinstance(parts[-1], Finish)
    assert parts[-1].reason == "stop"
