"""The scripted provider: every directive, step selection, tools, pacing, defaults."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from actors.llm import (
    ChatMessage,
    Finish,
    ModelRequest,
    ProviderInvalidRequestError,
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
from actors.llm.scripted import SCRIPT_DONE_TEXT, TOOLS_OFF_TEXT, step_index

MakeRequest = Callable[..., ModelRequest]
Collect = Callable[[ModelRequest], Awaitable[list[StreamPart]]]


def texts(parts: list[StreamPart]) -> list[str]:
    """The full text of each text block, in order."""
    blocks: dict[int, str] = {}
    for part in parts:
        if isinstance(part, TextStart):
            blocks[part.ordinal] = ""
        elif isinstance(part, TextChunk):
            blocks[part.ordinal] += part.delta
    return list(blocks.values())


def finish(parts: list[StreamPart]) -> Finish:
    assert [p for p in parts if isinstance(p, Finish)] == [parts[-1]]
    last = parts[-1]
    assert isinstance(last, Finish)
    return last


def assistant(*parts: Any) -> ChatMessage:
    return ChatMessage(role="assistant", parts=parts or (TextContent(text="ok"),))


def tool_result(call_id: str) -> ChatMessage:
    return ChatMessage(
        role="tool",
        parts=(ToolResultContent(id=call_id, name="read", output="contents"),),
    )


# -- the default reply -------------------------------------------------------------------------


async def test_without_a_script_it_echoes_the_prompt_in_chunks(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("Hello there"))

    assert parts == [
        TextStart(ordinal=0),
        TextChunk(ordinal=0, delta="Scripted"),
        TextChunk(ordinal=0, delta=" reply: "),
        TextChunk(ordinal=0, delta="Hello th"),
        TextChunk(ordinal=0, delta="ere"),
        TextEnd(ordinal=0),
        Finish(reason="stop", usage=Usage(input=3, output=7)),
    ]


async def test_the_default_reply_collapses_whitespace_and_keeps_80_characters(
    make_request: MakeRequest, collect: Collect
) -> None:
    prompt = "first  line\n\nsecond " + "x" * 200
    parts = await collect(make_request(prompt))

    expected = ("first line second " + "x" * 200)[:80]
    assert texts(parts) == [f"Scripted reply: {expected}"]


async def test_without_user_text_the_reply_is_fixed(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request())

    assert texts(parts) == ["Scripted reply."]
    assert finish(parts) == Finish(reason="stop", usage=Usage(input=0, output=4))


async def test_the_answer_is_deterministic(make_request: MakeRequest, collect: Collect) -> None:
    request = make_request("#text a\n#tool read {}\n---\n#text b")

    assert await collect(request) == await collect(request)


# -- text, reasoning, chunking -------------------------------------------------------------------


async def test_text_and_reasoning_blocks_share_ordinals_in_script_order(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("#reasoning Think\n#text Hi\n#reasoning More"))

    assert parts[:-1] == [
        ReasoningStart(ordinal=0),
        ReasoningChunk(ordinal=0, delta="Think"),
        ReasoningEnd(ordinal=0),
        TextStart(ordinal=1),
        TextChunk(ordinal=1, delta="Hi"),
        TextEnd(ordinal=1),
        ReasoningStart(ordinal=2),
        ReasoningChunk(ordinal=2, delta="More"),
        ReasoningEnd(ordinal=2),
    ]
    assert finish(parts) == Finish(reason="stop", usage=Usage(input=11, output=1, reasoning=3))


async def test_consecutive_text_lines_form_one_block(
    make_request: MakeRequest, collect: Collect
) -> None:
    script = "#text first\n#text\n#text   indented\n#reasoning r\n#text next block"
    parts = await collect(make_request(script))

    assert texts(parts) == ["first\n\n  indented", "next block"]


async def test_chunk_sets_the_piece_size_from_that_line_on(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("#text abcdefghij\n#chunk 3\n#text abcdefg"))

    deltas = [(p.ordinal, p.delta) for p in parts if isinstance(p, TextChunk)]
    assert deltas == [(0, "abcdefgh"), (0, "ij"), (1, "abc"), (1, "def"), (1, "g")]


async def test_prose_and_unknown_hash_words_in_the_prompt_are_ignored(
    make_request: MakeRequest, collect: Collect
) -> None:
    prompt = "Please answer.\n#hashtag is not a directive\n# a heading\n  #text Answer  \nThanks"
    parts = await collect(make_request(prompt))

    assert texts(parts) == ["Answer"]


async def test_a_prompt_without_directives_gets_the_default_reply(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("#hashtag\n---\nplain"))

    assert texts(parts) == ["Scripted reply: #hashtag --- plain"]


async def test_only_the_last_user_message_is_read(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("#text old", assistant(), "#text new"))

    assert texts(parts) == ["new"]


async def test_a_configured_script_wins_over_the_prompt(
    make_request: MakeRequest, collect: Collect
) -> None:
    request = make_request(
        "#text from the prompt",
        metadata={"script": "# configured\n\n#text from the configuration"},
    )

    assert texts(await collect(request)) == ["from the configuration"]


async def test_an_empty_configured_script_falls_back_to_the_prompt(
    make_request: MakeRequest, collect: Collect
) -> None:
    request = make_request("#text from the prompt", metadata={"script": ""})

    assert texts(await collect(request)) == ["from the prompt"]


# -- finish and usage ------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["content-filter", "length", "stop", "other", "unknown"])
async def test_finish_sets_the_reason(
    make_request: MakeRequest, collect: Collect, reason: str
) -> None:
    parts = await collect(make_request(f"#text partial\n#finish {reason}"))

    assert texts(parts) == ["partial"]
    assert finish(parts).reason == reason


async def test_usage_overrides_only_the_keys_given(
    make_request: MakeRequest, collect: Collect
) -> None:
    script = "#text four\n#usage input=100 cache-read=7 cache-write=3 cost=0.25"
    parts = await collect(make_request(script))

    assert finish(parts).usage == Usage(
        input=100, output=1, reasoning=0, cache_read=7, cache_write=3, cost=0.25
    )


async def test_derived_input_usage_counts_the_whole_history(
    make_request: MakeRequest, collect: Collect
) -> None:
    history = (
        "x" * 10,
        assistant(
            ReasoningContent(text="r" * 5),
            ToolCallContent(id="c", name="read", input={"a": 1}),
        ),
        tool_result("c"),
    )
    request = make_request(*history, system=("s" * 6,), metadata={"script": "#text hi"})
    parts = await collect(request)

    chars = 6 + 10 + 5 + len("read") + len('{"a":1}') + len("contents")
    assert finish(parts).usage.input == math.ceil(chars / 4)


# -- tool calls ----------------------------------------------------------------------------------


async def test_a_step_streams_text_then_each_tool_call_and_finishes_for_tools(
    make_request: MakeRequest, collect: Collect
) -> None:
    script = (
        '#text Let me look.\n#tool read {"path": "README.md", "limit": 20}\n'
        '#tool grep {"pattern": "a\\"b", "nested": {"k": [1, 2, null]}}'
    )
    parts = await collect(make_request(script))

    calls = [p for p in parts if isinstance(p, ToolCall)]
    assert calls == [
        ToolCall(id="call_0_0", name="read", input={"path": "README.md", "limit": 20}),
        ToolCall(
            id="call_0_1", name="grep", input={"pattern": 'a"b', "nested": {"k": [1, 2, None]}}
        ),
    ]
    for call in calls:
        own = [p for p in parts if getattr(p, "id", None) == call.id]
        assert isinstance(own[0], ToolInputStart)
        assert own[0].name == call.name
        assert all(isinstance(p, ToolInputChunk) for p in own[1:-2])
        assert own[-2:] == [ToolInputEnd(id=call.id), call]
        raw = "".join(p.delta for p in own if isinstance(p, ToolInputChunk))
        assert json.loads(raw) == call.input
        assert len(own) > 4  # the input really is streamed in several pieces
    first_tool = next(i for i, p in enumerate(parts) if isinstance(p, ToolInputStart))
    assert isinstance(parts[first_tool - 1], TextEnd)
    assert finish(parts).reason == "tool-calls"


async def test_a_tool_without_input_gets_an_empty_object(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("#tool list"))

    assert parts == [
        ToolInputStart(id="call_0_0", name="list"),
        ToolInputChunk(id="call_0_0", delta="{}"),
        ToolInputEnd(id="call_0_0"),
        ToolCall(id="call_0_0", name="list", input={}),
        Finish(reason="tool-calls", usage=Usage(input=3, output=1)),
    ]


@pytest.mark.parametrize(
    "fields",
    [{"tool_choice": "none"}, {"max_steps_reached": True}],
    ids=["tool-choice-none", "max-steps-reached"],
)
async def test_with_tools_off_tool_directives_are_skipped(
    make_request: MakeRequest, collect: Collect, fields: dict[str, Any]
) -> None:
    tools = (ToolSpec(name="read", description="Read a file", input_schema={"type": "object"}),)
    with_text = await collect(make_request("#text Done.\n#tool read {}", tools=tools, **fields))
    without_text = await collect(make_request("#tool read {}\n#finish tool-calls", **fields))

    for parts in (with_text, without_text):
        assert not [p for p in parts if isinstance(p, ToolInputStart | ToolCall)]
        assert finish(parts).reason == "stop"
    assert texts(with_text) == ["Done."]
    assert texts(without_text) == [TOOLS_OFF_TEXT]


# -- steps -----------------------------------------------------------------------------------------


def test_step_index_counts_assistant_messages_after_the_last_user_message() -> None:
    user = ChatMessage(role="user", parts=(TextContent(text="go"),))

    assert step_index(()) == 0
    assert step_index((assistant(),)) == 1
    assert step_index((assistant(), user)) == 0
    assert step_index((user, assistant(), tool_result("c"), assistant())) == 2


async def test_each_continuation_runs_the_next_step(
    make_request: MakeRequest, collect: Collect
) -> None:
    script = "#tool read {}\n#step\n#tool read {}\n#tool list {}\n---\n#text Done."
    first = make_request(script)
    second = make_request(
        script,
        assistant(ToolCallContent(id="call_0_0", name="read", input={})),
        tool_result("call_0_0"),
    )
    third = make_request(*second.messages, assistant(), tool_result("call_1_0"))

    first_parts, second_parts, third_parts = (
        await collect(first),
        await collect(second),
        await collect(third),
    )

    assert [p.id for p in first_parts if isinstance(p, ToolCall)] == ["call_0_0"]
    assert [p.id for p in second_parts if isinstance(p, ToolCall)] == ["call_1_0", "call_1_1"]
    assert texts(third_parts) == ["Done."]
    assert finish(third_parts).reason == "stop"


async def test_past_the_last_step_it_answers_a_short_final_text(
    make_request: MakeRequest, collect: Collect
) -> None:
    request = make_request("#tool read {}", assistant(), tool_result("call_0_0"))
    parts = await collect(request)

    assert texts(parts) == [SCRIPT_DONE_TEXT]
    assert finish(parts).reason == "stop"


async def test_a_script_of_comments_only_always_answers_the_final_text(
    make_request: MakeRequest, collect: Collect
) -> None:
    parts = await collect(make_request("hi", metadata={"script": "# nothing yet"}))

    assert texts(parts) == [SCRIPT_DONE_TEXT]


# -- bad requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [0, -1, "1", True, 1.0])
async def test_a_bad_attempt_number_is_an_invalid_request(
    make_request: MakeRequest, collect: Collect, attempt: object
) -> None:
    with pytest.raises(ProviderInvalidRequestError, match="attempt"):
        await collect(make_request("hi", metadata={"attempt": attempt}))


async def test_a_script_that_is_not_a_string_is_an_invalid_request(
    make_request: MakeRequest, collect: Collect
) -> None:
    with pytest.raises(ProviderInvalidRequestError, match="must be a string"):
        await collect(make_request("hi", metadata={"script": ["#text a"]}))
