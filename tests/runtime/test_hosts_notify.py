"""The host bus over a real PostgreSQL server's LISTEN/NOTIFY (:class:`NotifyHostBus`).

Each test creates its own database (channels are per database) and drops it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from feed import Feed

from actors.event_bus import EventBus
from actors.host_messages import HostMessage, NotifyHostBus
from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import PromptInput
from storage import SQLiteStore

asyncpg = pytest.importorskip("asyncpg")

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    name = f"hostbus_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(ADMIN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def _bus(stack: AsyncExitStack, dsn: str) -> NotifyHostBus:
    bus = NotifyHostBus(dsn)
    await bus.open()
    stack.push_async_callback(bus.close)
    return bus


class Inbox(list[HostMessage]):
    """What a host received; ``until(n)`` waits for the n-th message."""

    def __init__(self) -> None:
        super().__init__()
        self._grew = asyncio.Event()

    def __call__(self, message: HostMessage) -> None:
        self.append(message)
        self._grew.set()

    async def until(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self) < n:
                self._grew.clear()
                await self._grew.wait()


async def test_a_message_reaches_its_host_and_a_broadcast_every_other(dsn: str) -> None:
    async with AsyncExitStack() as stack:
        one, two = await _bus(stack, dsn), await _bus(stack, dsn)
        got_a, got_b, got_c = Inbox(), Inbox(), Inbox()
        stack.callback(await one.subscribe("host-a", got_a))
        stack.callback(await two.subscribe("host-b", got_b))
        stack.callback(await two.subscribe("host-c", got_c))
        wake = HostMessage(kind="wake", origin="host-a", session_ids=("ses_1",), scope="steer")
        await one.publish("host-b", wake)
        await got_b.until(1)
        assert got_b == [wake]
        many = tuple(f"ses_{i:026d}" for i in range(250))
        released = HostMessage(kind="released", origin="host-a", session_ids=many)
        await one.publish(None, released)
        await got_c.until(3)
        await got_b.until(4)
        # Split to stay under the payload limit, in order, nothing lost.
        assert [i for m in got_c for i in m.session_ids] == list(many)
        assert got_a == []  # the sender does not hear its own broadcast
        assert got_c[0].kind == "released"


class _CountingBus(NotifyHostBus):
    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.interrupts = 0

    async def publish(self, host_id: str | None, message: HostMessage) -> None:
        self.interrupts += message.kind == "interrupt"
        await super().publish(host_id, message)


async def _running_on_a(
    stack: AsyncExitStack, tmp_path: Path, dsn: str
) -> tuple[Runtime, Runtime, list[_CountingBus], Feed, str]:
    """Hosts A and B (one SQLite store, a NotifyHostBus each); a session whose
    execution runs a long tool on A."""
    store = await stack.enter_async_context(SQLiteStore(tmp_path / "shared.sqlite"))
    events, feed = EventBus(store), Feed()
    events.subscribe(feed)
    stack.callback(events.close)
    buses, hosts = [], []
    for host in ("host-a", "host-b"):
        bus = _CountingBus(dsn)
        await bus.open()
        stack.push_async_callback(bus.close)
        buses.append(bus)
        config = RuntimeConfig(
            data_dir=tmp_path / "data", default_directory=str(tmp_path), host_id=host
        )
        hosts.append(await stack.enter_async_context(Runtime(config, store=store, host_bus=bus)))
    a, b = hosts
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "sleep 30"}'))
    await feed.wait("session.tool.called", sessionID=s.id)
    return a, b, buses, feed, s.id


async def test_an_interrupt_through_b_reaches_a_over_notify(tmp_path: Path, dsn: str) -> None:
    async with AsyncExitStack() as stack:
        _, b, buses, feed, sid = await _running_on_a(stack, tmp_path, dsn)
        assert await b.interrupt(sid) is True
        done = await feed.wait("session.execution.interrupted", sessionID=sid)
        assert done["data"]["reason"] == "user"
        assert buses[1].interrupts == 1


async def test_an_interrupt_sent_while_the_owner_reconnects_still_reaches_it(
    tmp_path: Path, dsn: str
) -> None:
    """The owner's channel connection is ended by the server and its reconnect is
    refused twice: the first interrupt goes out while nobody listens for it."""
    async with AsyncExitStack() as stack:
        _, b, buses, feed, sid = await _running_on_a(stack, tmp_path, dsn)
        listener = buses[0].channel.listener
        connect, refused = listener._connect, 0

        async def refusing() -> object:
            nonlocal refused
            if refused < 2:
                refused += 1
                raise OSError("connection refused")
            return await connect()

        listener._connect = refusing
        admin = await asyncpg.connect(ADMIN)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", listener.server_pid)
        finally:
            await admin.close()
        assert await b.interrupt(sid) is True
        done = await feed.wait("session.execution.interrupted", sessionID=sid)
        assert done["data"]["reason"] == "user"
        assert refused == 2
        assert listener.connects == 2
        assert buses[1].interrupts >= 2  # the first was lost: sent again


async def _end_connections(dsn: str) -> int:
    """End every session on ``dsn``'s database from the server side, as a restart would."""
    name = dsn.rsplit("/", 1)[1]
    admin = await asyncpg.connect(ADMIN)
    try:
        ended = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await admin.close()
    return len(ended)


async def test_the_channel_heals_after_the_server_ends_its_connections(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="storage.postgres.listen")
    async with AsyncExitStack() as stack:
        healed = asyncio.Event()
        one = await _bus(stack, dsn)
        two = NotifyHostBus(dsn, on_reconnect=healed.set)
        await two.open()
        stack.push_async_callback(two.close)
        got = Inbox()
        stack.callback(await two.subscribe("host-b", got))
        assert await _end_connections(dsn) == 2
        async with asyncio.timeout(5):
            await healed.wait()  # B listens again, and says so
        # A's publish waits for its own connection to be back, then goes out.
        wake = HostMessage(kind="wake", origin="host-a", session_ids=("ses_1",))
        await one.publish("host-b", wake)
        await got.until(1)
        assert got == [wake]
        assert one.channel.listener.connects == 2
        assert two.channel.listener.connects == 2
    # Both ends of the outage at warning level, for an operator reading warnings.
    said = [r.getMessage() for r in caplog.records]
    assert said.count("lost the listen connection on sessionrt_hosts; reconnecting") == 2
    assert said.count("listening on sessionrt_hosts again") == 2


async def test_publishes_at_once_share_the_connection_and_all_arrive(dsn: str) -> None:
    async with AsyncExitStack() as stack:
        one, two = await _bus(stack, dsn), await _bus(stack, dsn)
        got = Inbox()
        stack.callback(await two.subscribe("host-b", got))
        sent = [
            HostMessage(kind="wake", origin="host-a", session_ids=(f"ses_{i}",)) for i in range(30)
        ]
        # One connection runs one statement at a time: concurrent publishers wait their turn.
        await asyncio.gather(*(one.publish("host-b", m) for m in sent))
        await got.until(30)
        assert sorted(m.session_ids for m in got) == sorted(m.session_ids for m in sent)


async def test_a_publish_without_a_server_fails_as_storage_broken(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage import StorageBrokenError
    from storage.postgres import channel as _pg_channel

    monkeypatch.setattr(_pg_channel, "PUBLISH_WAIT_S", 0.5)
    async with AsyncExitStack() as stack:
        bus = await _bus(stack, dsn)
        name = dsn.rsplit("/", 1)[1]
        admin = await asyncpg.connect(ADMIN)
        try:
            # Gone for good: the listener keeps trying, a publish gives up.
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        wake = HostMessage(kind="wake", origin="host-a", session_ids=("ses_1",))
        with pytest.raises(StorageBrokenError, match="no connection") as caught:
            await bus.publish("host-b", wake)
        assert "postgresql://" not in str(caught.value)


async def test_a_listener_reconnects_through_refused_connections(dsn: str) -> None:
    """A server restarting refuses connections for a while: the listener waits it
    out, however the connect function says so (a store's raises StorageBrokenError)."""
    from storage import StorageBrokenError
    from storage.postgres.listen import Listener

    refusals = 0

    async def connect() -> object:
        nonlocal refusals
        if listener.connects and refusals < 3:
            refusals += 1
            raise StorageBrokenError("cannot connect: refused")
        return await asyncpg.connect(dsn)

    back, arrived = asyncio.Event(), asyncio.Event()
    heard: list[str] = []

    def on_payload(payload: str) -> None:
        heard.append(payload)
        arrived.set()

    listener = Listener(connect, "c", on_payload=on_payload, on_reconnect=back.set)
    await listener.start()
    try:
        listener.kill_connection()
        async with asyncio.timeout(10):
            await back.wait()
        assert (refusals, listener.connects) == (3, 2)
        await listener.execute("SELECT pg_notify('c', 'after')")
        async with asyncio.timeout(5):
            await arrived.wait()
        assert heard == ["after"]
    finally:
        await listener.stop()


async def test_a_channel_that_cannot_connect_fails_to_open_as_storage_broken() -> None:
    from storage import StorageBrokenError

    bus = NotifyHostBus(f"postgresql://postgres:hunter2@127.0.0.1:5432/nx_{secrets.token_hex(4)}")
    with pytest.raises(StorageBrokenError, match="cannot listen for host notices") as caught:
        await bus.open()
    assert "hunter2" not in str(caught.value)
    assert bus.channel.listener is None
    await bus.close()  # nothing to close: a no-op


class _Counting:
    """The bus channel's ``on_reconnect`` (the runtime's scan doorbell), counting its rings."""

    def __init__(self, ring: Callable[[], None]) -> None:
        self._ring = ring
        self.rung = 0
        self.rang = asyncio.Event()

    def __call__(self) -> None:
        self.rung += 1
        self.rang.set()
        self._ring()


async def test_a_runtime_scans_at_once_when_its_host_channel_is_back(
    tmp_path: Path, dsn: str
) -> None:
    """Releases other hosts announced while the channel was down reached nobody:
    the lease scan runs as soon as it listens again, not at its next period."""
    config = RuntimeConfig(
        data_dir=tmp_path / "data", default_directory=str(tmp_path), database=dsn, host_id="a"
    )
    runtime = Runtime(config)
    bus = runtime.services.host_bus
    assert isinstance(bus, NotifyHostBus)
    channel = bus.channel
    rescan = channel._on_reconnect = _Counting(channel._on_reconnect)  # type: ignore[arg-type]
    async with runtime:
        before = rescan.rung
        rescan.rang.clear()
        listener = bus.channel.listener
        admin = await asyncpg.connect(ADMIN)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", listener._conn.get_server_pid())
        finally:
            await admin.close()
        async with asyncio.timeout(5):
            await rescan.rang.wait()
        assert rescan.rung == before + 1
        assert listener.connects == 2
