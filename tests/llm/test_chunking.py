"""Any chunking of the same answer yields the same normalized stream, in both formats.

The transport hands the decoder bytes cut anywhere: inside a frame, inside a
UTF-8 sequence, between CR and LF. Property: re-splitting the byte stream at
arbitrary points changes nothing in the normalized parts, whether the frames
end with LF or CRLF and whether keep-alive comments are interleaved.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm.fake_providers import (
    FakeProvider,
    Reply,
    anthropic_events,
    openai_chunks,
)

from actors.llm import (
    AnthropicProvider,
    ModelRequest,
    OpenAIProvider,
    ProviderConfig,
    StreamPart,
)
from actors.llm.anthropic import AnthropicStream
from actors.llm.openai import OpenAIStream
from protocol.shapes import ModelRef
from protocol.sse import SSEDecoder, SSEFrame

OPENAI_ANSWER = b"".join(
    openai_chunks(
        [
            {"reasoning_content": "pensé ☃ "},
            {"reasoning_content": "more"},
            {"content": "Héllo, "},
            {"content": "wörld 🌍\nline two"},
            {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "read"}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "ü"}'}}]},
            {"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "ls"}}]},
        ],
        finish="tool_calls",
    )
)

ANTHROPIC_ANSWER = b"".join(
    anthropic_events(
        [
            (
                {"type": "thinking", "thinking": ""},
                [
                    {"type": "thinking_delta", "thinking": "pensé ☃"},
                    {"type": "signature_delta", "signature": "c2ln"},
                ],
            ),
            (
                {"type": "text", "text": ""},
                [
                    {"type": "text_delta", "text": "Héllo, "},
                    {"type": "text_delta", "text": "wörld 🌍"},
                ],
            ),
            (
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}},
                [
                    {"type": "input_json_delta", "partial_json": '{"pa'},
                    {"type": "input_json_delta", "partial_json": 'th": "ü"}'},
                ],
            ),
        ],
        stop_reason="tool_use",
    )
)


def normalize(kind: str, chunks: Sequence[bytes]) -> list[StreamPart]:
    """What the adapter does with the bytes: SSE decoding, then the format's parser."""
    decoder = SSEDecoder()
    state = OpenAIStream("p") if kind == "openai" else AnthropicStream("p")
    out: list[StreamPart] = []

    def take(events: list[SSEFrame]) -> bool:
        for event in events:
            out.extend(state.event(event))
            if state.done:
                return True
        return False

    for chunk in chunks:
        if take(decoder.feed(chunk)):
            return out
    if not take(decoder.end(dispatch_open=True)):
        out.extend(state.end())
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def variant(data: bytes, crlf: bool, comments: bool) -> bytes:
    if comments:
        data = data.replace(b"\n\n", b"\n\n: keep-alive\n\n")
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    return data


EXPECTED = {
    "openai": normalize("openai", [OPENAI_ANSWER]),
    "anthropic": normalize("anthropic", [ANTHROPIC_ANSWER]),
}
ANSWERS = {"openai": OPENAI_ANSWER, "anthropic": ANTHROPIC_ANSWER}


def test_the_reference_answers_are_rich() -> None:
    for parts in EXPECTED.values():
        kinds = {type(p).__name__ for p in parts}
        assert {"ReasoningChunk", "TextChunk", "ToolInputChunk", "ToolCall", "Finish"} <= kinds


@given(
    kind=st.sampled_from(["openai", "anthropic"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
    crlf=st.booleans(),
    comments=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_any_chunking_gives_the_same_parts(
    kind: str, cuts: list[int], crlf: bool, comments: bool
) -> None:
    data = variant(ANSWERS[kind], crlf, comments)
    assert normalize(kind, split(data, cuts)) == EXPECTED[kind]


@given(kind=st.sampled_from(["openai", "anthropic"]), crlf=st.booleans())
@settings(max_examples=20, deadline=None)
def test_byte_by_byte(kind: str, crlf: bool) -> None:
    data = variant(ANSWERS[kind], crlf, comments=False)
    assert normalize(kind, [data[i : i + 1] for i in range(len(data))]) == EXPECTED[kind]


def test_a_lone_cr_ends_lines_too() -> None:
    data = OPENAI_ANSWER.replace(b"\n", b"\r")
    assert normalize("openai", split(data, [5, 17, 400])) == EXPECTED["openai"]


def test_multi_line_data_is_joined_with_a_newline() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"event: x\ndata: a\ndata:b\nid: 1\nretry: 5\n\n")
    assert events == [SSEFrame(id=1, event="x", data="a\nb")]


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kind=st.sampled_from(["openai", "anthropic"]), cuts=st.lists(st.integers(0, 5000)))
async def test_through_a_real_socket_too(fake: FakeProvider, kind: str, cuts: list[int]) -> None:
    config = ProviderConfig(
        id="p",
        kind=kind,  # type: ignore[arg-type]
        base_url=fake.openai_url if kind == "openai" else fake.anthropic_url,
    )
    adapter = OpenAIProvider(config) if kind == "openai" else AnthropicProvider(config)
    fake.replies.append(Reply.stream(split(ANSWERS[kind], cuts)))
    request = ModelRequest(
        session_id="ses_t", agent="build", model=ModelRef(id="m", provider_id="p")
    )
    try:
        parts = [part async for part in adapter.stream(request)]
    finally:
        await adapter.aclose()
    assert parts == EXPECTED[kind]
