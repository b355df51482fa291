"""Streams and requests that would hold the server forever are bounded, each alone.

A subscriber that never reads, one that falls too far behind, a request whose
headers or body never finish, and a shutdown with followers attached. Raw
sockets stand in for misbehaving clients; guards are timeouts, never sleeps.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
from http_helpers import Client, collect_until_synced, create_session, frames, runtime_of

from protocol import events as ev
from server.app import FEED

GUARD_S = 30
BLOB = "x" * 8192


def _delta(i: int) -> ev.TextDelta:
    return ev.TextDelta(session_id="ses_x", assistant_message_id="msg_x", ordinal=i, delta=BLOB)


async def _raw(client: Client, request: bytes, *, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (client.server.host, client.server.port))
    await loop.sock_sendall(sock, request)
    return sock


async def _read_to_end(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    chunks = []
    while chunk := await loop.sock_recv(sock, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _body(raw: bytes) -> bytes:
    """The body of a raw chunked response (chunk boundaries may fall anywhere in a frame)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    body = []
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        body.append(rest[:n])
        rest = rest[n + 2 :]
        if n == 0:
            break
    return b"".join(body)


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The SSE frames in a raw chunked response: its ``event``/``data`` lines in order."""
    out: list[dict[str, Any]] = []
    for line in _body(raw).split(b"\n"):
        if line.startswith(b"event: "):
            out.append({"event": line[7:].decode().strip()})
        elif line.startswith(b"data: ") and out and "data" not in out[-1]:
            out[-1]["data"] = orjson.loads(line[6:])
    return out


def _get(client: Client, path: str) -> bytes:
    host = f"{client.server.host}:{client.server.port}"
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


async def _healthy(client: Client) -> AsyncIterator[dict[str, Any]]:
    response = await client.get("/api/event")
    stream = frames(response)
    assert (await anext(stream))["event"] == "server.connected"
    return stream


async def test_a_subscriber_that_never_reads_is_dropped_with_a_reason_and_the_others_get_all(
    make_client: Any,
) -> None:
    client = await make_client(stream_write_timeout_s=1.0, event_queue_bytes=256 * 1024 * 1024)
    feed = client.app[FEED]
    bus = runtime_of(client).bus
    stuck = await _raw(client, _get(client, "/api/event"), rcvbuf=4096)
    healthy = await _healthy(client)
    total = 3000  # 24 MB: far more than every socket buffer between them
    received = 0

    async def read_healthy() -> None:
        nonlocal received
        async for f in healthy:
            if f.get("event") == "session.text.delta":
                assert f["data"]["data"]["ordinal"] == received  # in order, none lost
                received += 1
                if received == total:
                    return

    reader = asyncio.ensure_future(read_healthy())
    async with asyncio.timeout(GUARD_S):
        for i in range(total):
            bus.live(_delta(i))
            if i % 64 == 0:
                await asyncio.sleep(0)  # let the healthy reader keep pace (no sync meant)
        # Nothing is published any more, so only the stalled write can end it.
        await feed.dropped.wait()
        raw = await _read_to_end(stuck)
        await reader
    stuck.close()
    assert received == total
    assert feed.drops == {"stalled": 1}
    got = _events(raw)
    assert got[0]["event"] == "server.connected"
    assert got[-1]["event"] == "server.connection.dropped"
    assert got[-1]["data"]["data"]["reason"] == "stalled"
    assert len(feed) == 1


async def test_what_one_tick_publishes_is_one_fan_out_written_in_place_in_order(
    make_client: Any,
) -> None:
    client = await make_client()
    feed = client.app[FEED]
    bus = runtime_of(client).bus
    streams = [await _healthy(client) for _ in range(3)]
    fan_outs, queued = feed.fan_outs, feed.queued
    for i in range(50):  # no await between them: one tick
        bus.live(
            ev.TextDelta(session_id="ses_x", assistant_message_id="msg_x", ordinal=i, delta="d")
        )
    async with asyncio.timeout(GUARD_S):
        for stream in streams:
            got = [(await anext(stream))["data"]["data"]["ordinal"] for _ in range(50)]
            assert got == list(range(50))
    # One join and one pass over the connections for the 50 events, and each
    # idle connection written to in place (its task not woken).
    assert feed.fan_outs - fan_outs == 1
    assert feed.queued == queued


async def test_a_subscriber_that_fell_behind_is_caught_up_by_its_task_in_order(
    make_client: Any,
) -> None:
    client = await make_client(event_queue_bytes=256 * 1024 * 1024)
    feed = client.app[FEED]
    bus = runtime_of(client).bus
    stream = await _healthy(client)
    total = 3000  # 24 MB, not read meanwhile: more than every socket buffer between them
    for i in range(total):
        bus.live(_delta(i))
        if i % 64 == 0:
            await asyncio.sleep(0)
    assert feed.queued > 0  # it was behind: some chunks waited in its own queue
    ordinals = []
    async with asyncio.timeout(GUARD_S):
        while len(ordinals) < total:
            f = await anext(stream)
            if f.get("event") == "session.text.delta":
                ordinals.append(f["data"]["data"]["ordinal"])
    assert ordinals == list(range(total))
    assert not feed.drops


async def test_an_overflowing_subscriber_is_dropped_alone_after_a_final_frame(
    make_client: Any,
) -> None:
    client = await make_client(event_queue_bytes=64 * 1024)
    feed = client.app[FEED]
    bus = runtime_of(client).bus
    slow = await client.get("/api/event")
    slow_stream = frames(slow)
    assert (await anext(slow_stream))["event"] == "server.connected"
    healthy = await _healthy(client)
    total = 2000
    received = 0
    progress = asyncio.Condition()

    async def read_healthy() -> None:
        nonlocal received
        async for f in healthy:
            if f.get("event") == "session.text.delta":
                async with progress:
                    received += 1
                    progress.notify_all()
                if received == total:
                    return

    reader = asyncio.ensure_future(read_healthy())
    async with asyncio.timeout(GUARD_S):
        for i in range(total):
            async with progress:  # flow control for the healthy reader only
                await progress.wait_for(lambda i=i: received >= i - 4)
            bus.live(_delta(i))
        await reader
        rest = [f async for f in slow_stream]
    assert received == total
    assert feed.drops == {"overflow": 1}
    assert rest[-1]["event"] == "server.connection.dropped"
    assert rest[-1]["data"]["data"]["reason"] == "overflow"
    deltas = sum(1 for f in rest if f.get("event") == "session.text.delta")
    assert deltas < total


async def test_headers_that_never_finish_time_out_and_close_the_connection(
    make_client: Any,
) -> None:
    client = await make_client(header_timeout_s=0.5)
    host = f"{client.server.host}:{client.server.port}"
    sock = await _raw(client, f"GET /api/session HTTP/1.1\r\nHost: {host}\r\n".encode())
    async with asyncio.timeout(GUARD_S):
        assert await _read_to_end(sock) == b""
    sock.close()
    # The server still answers everyone else.
    assert (await client.get("/api/session")).status == 200


async def test_a_body_shorter_than_its_content_length_is_a_408_and_a_closed_connection(
    make_client: Any,
) -> None:
    client = await make_client(body_timeout_s=0.5)
    host = f"{client.server.host}:{client.server.port}"
    head = (
        f"POST /api/session HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n"
    )
    sock = await _raw(client, head.encode() + b'{"title": ')
    async with asyncio.timeout(GUARD_S):
        raw = await _read_to_end(sock)
    sock.close()
    status, _, rest = raw.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408")
    assert b"Connection: close" in rest
    body = orjson.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["_tag"] == "RequestTimeoutError"


async def test_shutdown_ends_every_follower_at_once_with_its_last_frame(make_client: Any) -> None:
    # Heartbeats far away: a follower that only noticed shutdown at its next
    # heartbeat (or event) would outlive the guard.
    client = await make_client(heartbeat_s=3600)
    sid = (await create_session(client))["id"]
    log = await client.get(f"/api/experimental/session/{sid}/log?follow=true")
    await collect_until_synced(log)
    feeds = [await _healthy(client) for _ in range(3)]
    async with asyncio.timeout(GUARD_S):
        await client.server.close()
        rest = [f async for f in frames(log)]
        ends = [[f.get("event") async for f in stream] for stream in feeds]
    assert rest == []  # the log stream ended cleanly, nothing after the marker
    assert all(end[-1:] == ["server.instance.disposed"] for end in ends)
