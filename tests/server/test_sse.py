"""The two streams over real HTTP: exact resume, follow, heartbeat, isolation, dispose."""

from __future__ import annotations

import asyncio
from typing import Any

from http_helpers import Client, collect_until_synced, create_session, frames, runtime_of
from manual_clock import ManualClock

from protocol import events as ev
from protocol.requests import PromptInput, UpdateSessionInput


async def test_replay_is_exclusive_of_after_and_ends_with_one_marker(client: Client) -> None:
    sid = (await create_session(client))["id"]
    sessions = runtime_of(client).sessions
    for i in range(5):
        await sessions.update(sid, UpdateSessionInput(title=f"t{i}"))
    response = await client.get(f"/api/experimental/session/{sid}/log?after=2")
    got = [f async for f in frames(response)]
    assert [f.get("id") for f in got[:-1]] == [3, 4, 5, 6]
    assert got[-1] == {
        "event": "log.synced",
        "data": {"type": "log.synced", "aggregateID": sid, "seq": 6},
    }
    envelope = got[0]["data"]
    assert envelope["durable"] == {"aggregateID": sid, "seq": 3, "version": 1}
    assert envelope["type"] == "session.renamed"


async def test_cursor_at_and_past_the_end(client: Client) -> None:
    sid = (await create_session(client))["id"]
    for after in (1, 99):
        response = await client.get(f"/api/experimental/session/{sid}/log?after={after}")
        got = [f async for f in frames(response)]
        assert got == [
            {"event": "log.synced", "data": {"type": "log.synced", "aggregateID": sid, "seq": 1}}
        ]


async def test_last_event_id_resumes_like_after(client: Client) -> None:
    sid = (await create_session(client))["id"]
    await runtime_of(client).sessions.update(sid, UpdateSessionInput(title="x"))
    response = await client.get(
        f"/api/experimental/session/{sid}/log", headers={"Last-Event-ID": "1"}
    )
    assert [f.get("id") for f in await collect_until_synced(response)] == [2, None]


async def test_follow_has_no_gap_and_no_duplicate_across_a_live_append_race(
    client: Client,
) -> None:
    sid = (await create_session(client))["id"]
    sessions = runtime_of(client).sessions
    total = 300

    async def writer() -> None:
        for i in range(total):
            await sessions.update(sid, UpdateSessionInput(title=str(i)))

    task = asyncio.ensure_future(writer())
    await asyncio.sleep(0)  # the race: appends are already flowing when the stream opens
    response = await client.get(f"/api/experimental/session/{sid}/log?after=0&follow=true")
    seqs: list[int] = []
    synced = 0
    async for f in frames(response):
        if f.get("event") == "log.synced":
            synced += 1
            continue
        if "id" in f:
            seqs.append(f["id"])
        if seqs and seqs[-1] == total + 1:
            break
    response.close()
    await task
    assert synced == 1
    assert seqs == list(range(1, total + 2))


async def test_follow_never_sends_live_only_deltas(client: Client) -> None:
    sid = (await create_session(client))["id"]
    response = await client.get(f"/api/experimental/session/{sid}/log?follow=true")
    await collect_until_synced(response)
    await runtime_of(client).sessions.prompt(sid, PromptInput(text="hello"))
    types = []
    async for f in frames(response):
        types.append(f.get("event"))
        if f.get("event") == "session.execution.succeeded":
            break
    response.close()
    assert "session.text.delta" not in types
    assert "session.text.ended" in types


async def test_a_deleted_session_ends_the_followed_stream(client: Client) -> None:
    sid = (await create_session(client))["id"]
    response = await client.get(f"/api/experimental/session/{sid}/log?follow=true")
    await collect_until_synced(response)
    await runtime_of(client).sessions.remove(sid)
    rest = [f async for f in frames(response)]  # ends by itself
    assert [f.get("event") for f in rest] == ["session.deleted"]


async def test_unknown_session_log_is_404(client: Client) -> None:
    response = await client.get("/api/experimental/session/ses_none/log")
    assert response.status == 404


async def test_heartbeats_keep_idle_streams_alive_on_the_runtime_clock(make_client: Any) -> None:
    """An idle stream's ping goes out once ``heartbeat_s`` has passed on the runtime's
    clock, and not a millisecond before."""
    clock = ManualClock()
    client = await make_client(heartbeat_s=30, clock=clock)
    sid = (await create_session(client))["id"]
    for path, first in (
        (f"/api/experimental/session/{sid}/log?follow=true", "log.synced"),
        ("/api/event", "server.connected"),
    ):
        response = await client.get(path)
        stream = frames(response)
        async for f in stream:
            if f.get("event") == first:
                break
        due = clock.now_ms() + 30_000
        await clock.until_waiting(due)  # the idle stream waits for its heartbeat
        clock.advance(29_999)
        assert due in clock.waits()  # not yet
        clock.advance(1)
        assert due not in clock.waits()
        assert await anext(stream) == {"comment": "ping"}
        response.close()
        # Off the closed stream's next heartbeat: the next stream's due differs from it.
        clock.advance(10_000)


async def test_event_feed_sends_connected_then_durable_and_live_events(client: Client) -> None:
    response = await client.get("/api/event")
    stream = frames(response)
    first = await anext(stream)
    assert first["event"] == "server.connected"
    sid = (await create_session(client))["id"]
    await runtime_of(client).sessions.prompt(sid, PromptInput(text="hello"))
    seen = set()
    async for f in stream:
        seen.add(f.get("event"))
        if f.get("event") == "session.execution.succeeded":
            break
    response.close()
    assert {"session.created", "session.text.delta", "session.step.ended"} <= seen


async def test_a_slow_consumer_is_dropped_alone(make_client: Any) -> None:
    client = await make_client(event_queue_bytes=16 * 8300)
    bus = runtime_of(client).bus
    healthy = await client.get("/api/event")
    slow = await client.get("/api/event")
    healthy_stream, slow_stream = frames(healthy), frames(slow)
    assert (await anext(healthy_stream))["event"] == "server.connected"
    assert (await anext(slow_stream))["event"] == "server.connected"
    received = 0
    progress = asyncio.Condition()
    total = 3000
    blob = "x" * 8192

    async def read_healthy() -> None:
        nonlocal received
        async for f in healthy_stream:
            if f.get("event") == "session.text.delta":
                async with progress:
                    received += 1
                    progress.notify_all()
                if received == total:
                    return

    reader = asyncio.ensure_future(read_healthy())
    for i in range(total):
        # Flow control for the healthy reader only: it is never more than 8 behind.
        async with progress:
            await progress.wait_for(lambda i=i: received >= i - 8)
        bus.live(
            ev.TextDelta(session_id="ses_x", assistant_message_id="msg_x", ordinal=0, delta=blob)
        )
    await asyncio.wait_for(reader, 30)
    assert received == total
    # The slow one got a prefix and then its stream was closed by the server.
    slow_count = sum(1 for f in [f async for f in slow_stream] if "data" in f)
    assert slow_count < total
    healthy.close()


async def test_disposed_is_sent_before_shutdown(client: Client) -> None:
    response = await client.get("/api/event")
    stream = frames(response)
    assert (await anext(stream))["event"] == "server.connected"
    await client.server.close()
    rest = [f.get("event") async for f in stream]
    assert rest[-1] == "server.instance.disposed"


async def test_a_log_that_cannot_be_read_ends_the_followed_stream_cleanly(
    client: Client, monkeypatch: Any, caplog: Any
) -> None:
    """The database going away mid-follow (a restart) ends the stream with its
    last chunk: the reader resumes from its last id. Not a 500 written into a
    stream already under way."""
    from storage import StorageBrokenError

    sid = (await create_session(client))["id"]
    response = await client.get(f"/api/experimental/session/{sid}/log?follow=true")
    await collect_until_synced(response)
    runtime = runtime_of(client)

    async def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise StorageBrokenError("read failed: ConnectionDoesNotExistError")

    monkeypatch.setattr(runtime.store, "read", unreadable)
    await runtime.sessions.update(sid, UpdateSessionInput(title="rung"))
    async with asyncio.timeout(5):
        rest = [f async for f in frames(response)]  # ends by itself, and cleanly
    assert rest == []
    assert not [r for r in caplog.records if r.getMessage().startswith("unhandled error")]
    assert any("session log of" in r.getMessage() for r in caplog.records)
