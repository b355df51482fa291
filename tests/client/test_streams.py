"""Streaming operations: cold async iterators of SSE frames that close what they open."""

from __future__ import annotations

import asyncio

import pytest
from client.fake_server import FakeServer

from protocol.client import CallOptions, Client, ClientError, EventStream, SSEEvent
from protocol.errors import SessionNotFoundError
from protocol.operations import LogQuery

LOG = "/api/experimental/session/ses_1/log"

FRAMES = (
    b": ping\n\n"
    b'id: 1\nevent: session.inbox.enqueued\ndata: {"id": "evt_1", "durable": {"seq": 1}}\n\n'
    b": ping\n"
    b'id: 2\nevent: session.created\ndata: {"multi":\ndata: "line"}\n\n'
    b'event: log.synced\ndata: {"type": "log.synced", "seq": 2}\n\n'
)


def test_a_stream_is_not_a_coroutine() -> None:
    client = Client("http://127.0.0.1:9")

    stream = client.sessions.log("ses_1")

    assert isinstance(stream, EventStream)
    assert not hasattr(stream, "__await__")


async def test_nothing_is_sent_before_the_first_iteration(client: Client, fake: FakeServer) -> None:
    fake.sse("GET", LOG, [FRAMES])

    stream = client.sessions.log("ses_1")
    assert fake.requests == []
    await anext(stream)

    assert len(fake.requests) == 1
    await stream.aclose()


async def test_frames_are_decoded_and_comments_skipped(client: Client, fake: FakeServer) -> None:
    fake.sse("GET", LOG, [FRAMES])

    stream = client.sessions.log("ses_1", LogQuery(after=0, follow=False))
    got = [event async for event in stream]

    assert got == [
        SSEEvent(
            id=1,
            event="session.inbox.enqueued",
            data={"id": "evt_1", "durable": {"seq": 1}},
        ),
        SSEEvent(id=2, event="session.created", data={"multi": "line"}),
        SSEEvent(id=None, event="log.synced", data={"type": "log.synced", "seq": 2}),
    ]
    assert stream.closed
    assert stream.last_event_id == "2"
    assert fake.last.query == (("after", "0"), ("follow", "false"))
    assert fake.last.headers["Accept"] == "text/event-stream"
    assert "Last-Event-ID" not in fake.last.headers


async def test_frames_split_across_writes_are_reassembled(client: Client, fake: FakeServer) -> None:
    chunks = [FRAMES[i : i + 7] for i in range(0, len(FRAMES), 7)]
    fake.sse("GET", LOG, chunks)

    got = [event.id async for event in client.sessions.log("ses_1")]

    assert got == [1, 2, None]


async def test_last_event_id_and_query_are_sent(client: Client, fake: FakeServer) -> None:
    fake.sse("GET", LOG, [b""])

    stream = client.sessions.log("ses_1", LogQuery(after=5, follow=True), last_event_id=7)
    assert [e async for e in stream] == []

    assert fake.last.query == (("after", "5"), ("follow", "true"))
    assert fake.last.headers["Last-Event-ID"] == "7"


async def test_a_declared_error_surfaces_on_first_iteration(
    client: Client, fake: FakeServer
) -> None:
    fake.json(
        "GET",
        LOG,
        {"_tag": "SessionNotFoundError", "message": "nope", "sessionID": "ses_1"},
        status=404,
    )
    stream = client.sessions.log("ses_1")

    with pytest.raises(SessionNotFoundError):
        await anext(stream)
    assert stream.closed
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_success_that_is_not_an_event_stream_is_refused(
    client: Client, fake: FakeServer
) -> None:
    fake.json("GET", "/api/event", {"data": []})

    with pytest.raises(ClientError) as caught:
        await anext(client.events.subscribe())

    assert caught.value.reason == "unsupported_content_type"


async def test_a_502_on_open_is_an_unexpected_status(client: Client, fake: FakeServer) -> None:
    fake.raw("GET", "/api/event", b"<html>down</html>", status=502, content_type="text/html")

    with pytest.raises(ClientError) as caught:
        await anext(client.events.subscribe())

    assert (caught.value.reason, caught.value.status) == ("unexpected_status", 502)


async def test_bad_frame_data_is_a_malformed_response(client: Client, fake: FakeServer) -> None:
    fake.sse("GET", "/api/event", [b'data: {"ok": 1}\n\ndata: {not json\n\n'])
    stream = client.events.subscribe()

    assert (await anext(stream)).data == {"ok": 1}
    with pytest.raises(ClientError) as caught:
        await anext(stream)
    assert caught.value.reason == "malformed_response"
    assert stream.closed


async def test_a_connection_lost_mid_stream_is_a_transport_error(
    client: Client, fake: FakeServer
) -> None:
    fake.sse("GET", LOG, [b"id: 1\ndata: {}\n\n"], then="abort")
    stream = client.sessions.log("ses_1")

    assert (await anext(stream)).id == 1
    with pytest.raises(ClientError) as caught:
        await anext(stream)
    assert caught.value.reason == "transport"
    # Never reconnects on its own.
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert len(fake.requests) == 1


async def test_a_refused_stream_is_a_transport_error(unused_tcp_port: int) -> None:
    async with Client(f"http://127.0.0.1:{unused_tcp_port}") as client:
        with pytest.raises(ClientError) as caught:
            await anext(client.events.subscribe())

    assert caught.value.reason == "transport"


async def test_the_timeout_bounds_opening_not_the_stream(client: Client, fake: FakeServer) -> None:
    fake.hang("GET", "/api/event")

    with pytest.raises(ClientError) as caught:
        await anext(client.events.subscribe(options=CallOptions(timeout=0.05)))

    assert caught.value.reason == "transport"


async def test_cancelling_the_consumer_closes_the_response(
    client: Client, fake: FakeServer
) -> None:
    fake.sse("GET", "/api/event", [b"event: server.connected\ndata: {}\n\n"], then="hang")
    stream = client.events.subscribe(options=CallOptions(timeout=0.05))
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in stream:
            got_first.set()

    consumer = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await got_first.wait()
    consumer.cancel()

    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert stream.closed
    async with asyncio.timeout(5):
        await fake.disconnected.wait()


async def test_breaking_out_of_async_with_closes_the_response(
    client: Client, fake: FakeServer
) -> None:
    fake.sse("GET", "/api/event", [b"data: 1\n\ndata: 2\n\n"], then="hang")

    async with client.events.subscribe() as stream:
        async for event in stream:
            assert event.data == 1
            break

    assert stream.closed
    async with asyncio.timeout(5):
        await fake.disconnected.wait()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_aclose_before_opening_sends_nothing(client: Client, fake: FakeServer) -> None:
    stream = client.events.subscribe()
    await stream.aclose()

    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert fake.requests == []
