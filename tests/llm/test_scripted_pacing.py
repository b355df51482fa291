"""The scripted provider's pacing: ``#delay`` and cancelling a slow stream."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Awaitable, Callable

import pytest

from actors.llm import (
    ChatMessage,
    ModelRequest,
    ScriptedProvider,
    StreamPart,
    TextChunk,
    TextContent,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
)

MakeRequest = Callable[..., ModelRequest]
Collect = Callable[[ModelRequest], Awaitable[list[StreamPart]]]

ASSISTANT_TURN = ChatMessage(role="assistant", parts=(TextContent(text="ok"),))


def texts(parts: list[StreamPart]) -> list[str]:
    return ["".join(p.delta for p in parts if isinstance(p, TextChunk))]


async def test_delay_streams_the_same_parts_in_the_same_order(
    make_request: MakeRequest, collect: Collect
) -> None:
    body = '#text abcdefghijklmnopqrstuvwxyz\n#tool read {"path": "a/b/c/d.txt"}\n#text end'
    slow = await collect(make_request("go", metadata={"script": "#delay 1\n" + body}))
    fast = await collect(make_request("go", metadata={"script": "#delay 0\n" + body}))

    assert slow == fast
    assert len(slow) == 16


async def test_delay_waits_before_every_chunk_after_it(make_request: MakeRequest) -> None:
    events: list[StreamPart | float] = []

    async def sleep(seconds: float) -> None:
        events.append(seconds)

    provider = ScriptedProvider(sleep=sleep)
    script = "#text abc\n#delay 5\n#chunk 2\n#text defg\n#tool t {}"
    async for part in provider.stream(make_request(script)):
        events.append(part)

    assert events[:-1] == [
        TextStart(ordinal=0),
        TextChunk(ordinal=0, delta="abc"),
        TextEnd(ordinal=0),
        TextStart(ordinal=1),
        0.005,
        TextChunk(ordinal=1, delta="de"),
        0.005,
        TextChunk(ordinal=1, delta="fg"),
        TextEnd(ordinal=1),
        ToolInputStart(id="call_0_0", name="t"),
        0.005,
        ToolInputChunk(id="call_0_0", delta="{}"),
        ToolInputEnd(id="call_0_0"),
        ToolCall(id="call_0_0", name="t", input={}),
    ]


async def test_delay_applies_only_to_the_rest_of_its_step(
    make_request: MakeRequest, collect: Collect
) -> None:
    # Step 1 has no delay: were the 60 s delay of step 0 still in force, the
    # test would hit its timeout instead of finishing at once.
    request = make_request("#delay 60000\n#tool read {}\n---\n#text fast", ASSISTANT_TURN)

    async with asyncio.timeout(5):
        assert texts(await collect(request)) == ["fast"]


async def test_cancelling_the_consumer_of_a_slow_stream_closes_the_generator(
    make_request: MakeRequest,
) -> None:
    stream = ScriptedProvider().stream(make_request("#delay 60000\n#text " + "x" * 64))
    received: list[StreamPart] = []
    started = asyncio.Event()

    async def consume() -> None:
        async for part in stream:
            received.append(part)
            started.set()

    async with asyncio.timeout(5):
        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert received == [TextStart(ordinal=0)]
    assert isinstance(stream, types.AsyncGeneratorType)
    assert stream.ag_frame is None  # finished: the generator's body cannot resume
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_consumer_that_stops_reading_can_close_the_stream(
    make_request: MakeRequest,
) -> None:
    stream = ScriptedProvider().stream(make_request("#text " + "x" * 64))

    async with contextlib.aclosing(stream):
        async for part in stream:
            if isinstance(part, TextChunk):
                break

    assert isinstance(stream, types.AsyncGeneratorType)
    assert stream.ag_frame is None
