"""The client is unopened -> open -> closed, once; it owns its session, not a lent connector."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from client.fake_server import SESSION, FakeServer

from protocol.client import Client, ClientError, LifecycleState, SSEEvent


def test_construction_is_synchronous_and_does_no_io() -> None:
    # No running loop here: making an aiohttp session now would fail or warn.
    client = Client("http://127.0.0.1:9", headers={"X": "1"}, timeout=None)

    assert client.state is LifecycleState.UNOPENED
    assert repr(client) == "<Client http://127.0.0.1:9 unopened>"


def test_a_relative_base_url_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute"):
        Client("/api")


async def test_calling_an_unopened_client_raises_closed(fake: FakeServer) -> None:
    client = Client(fake.url)

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "closed"
    assert "async with" in str(caught.value)
    assert fake.requests == []


async def test_open_then_closed(fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1", {"data": SESSION})
    client = Client(fake.url)

    states = [client.state]
    async with client as entered:
        assert entered is client
        states.append(client.state)
        await client.sessions.get("ses_1")
    states.append(client.state)

    assert states == [LifecycleState.UNOPENED, LifecycleState.OPEN, LifecycleState.CLOSED]

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")
    assert caught.value.reason == "closed"
    assert len(fake.requests) == 1


async def test_reentering_raises(fake: FakeServer) -> None:
    client = Client(fake.url)
    async with client:
        with pytest.raises(RuntimeError, match="already open"):
            await client.__aenter__()
    with pytest.raises(RuntimeError, match="already closed"):
        await client.__aenter__()


async def test_aclose_is_idempotent_and_closes_an_unopened_client(fake: FakeServer) -> None:
    client = Client(fake.url)
    await client.aclose()
    await client.aclose()

    assert client.state is LifecycleState.CLOSED
    with pytest.raises(RuntimeError):
        await client.__aenter__()


async def test_a_lent_connector_is_left_open(fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1", {"data": SESSION})
    connector = aiohttp.TCPConnector()
    try:
        async with Client(fake.url, connector=connector) as client:
            await client.sessions.get("ses_1")
        assert not connector.closed
        # A second client can use the same connector.
        async with Client(fake.url, connector=connector) as client:
            await client.sessions.get("ses_1")
    finally:
        await connector.close()


async def test_a_connector_handed_over_is_closed_with_the_client(fake: FakeServer) -> None:
    connector = aiohttp.TCPConnector()
    async with Client(fake.url, connector=connector, connector_owner=True):
        pass

    assert connector.closed


async def test_closing_the_client_closes_its_open_streams(fake: FakeServer) -> None:
    fake.sse("GET", "/api/event", [b"event: server.connected\ndata: {}\n\n"], then="hang")
    client = Client(fake.url)
    await client.__aenter__()
    stream = client.events.subscribe()
    seen: list[SSEEvent] = []
    got_first = asyncio.Event()

    async def consume() -> None:
        async for event in stream:
            seen.append(event)
            # Setting the event wakes the test only after this task blocks in the next read.
            got_first.set()

    consumer = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await got_first.wait()

    await client.aclose()

    with pytest.raises(ClientError) as caught:
        await consumer
    assert caught.value.reason == "closed"
    assert [e.event for e in seen] == ["server.connected"]
    assert stream.closed
    async with asyncio.timeout(5):
        await fake.disconnected.wait()
    with pytest.raises(ClientError):
        await anext(stream)


async def test_a_stream_the_client_closed_before_it_was_read_reports_closed(
    fake: FakeServer,
) -> None:
    fake.sse("GET", "/api/event", [b"data: 1\n\ndata: 2\n\n"], then="hang")
    async with Client(fake.url) as client:
        stream = client.events.subscribe()
        await anext(stream)

    # Even a frame already buffered is not delivered after the close.
    with pytest.raises(ClientError) as caught:
        await anext(stream)
    assert caught.value.reason == "closed"


async def test_a_stream_made_while_open_fails_closed_after_close(fake: FakeServer) -> None:
    async with Client(fake.url) as client:
        stream = client.events.subscribe()

    with pytest.raises(ClientError) as caught:
        await anext(stream)

    assert caught.value.reason == "closed"
    assert fake.requests == []


async def test_closing_the_client_fails_a_call_in_flight_as_closed(fake: FakeServer) -> None:
    fake.hang("POST", "/api/session/ses_1/resume")
    client = Client(fake.url)
    await client.__aenter__()
    call = asyncio.create_task(client.sessions.resume("ses_1"))
    async with asyncio.timeout(5):
        await fake.arrived.wait()

    await client.aclose()

    with pytest.raises(ClientError) as caught:
        await call
    assert caught.value.reason == "closed"
