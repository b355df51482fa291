"""Leases and fencing on a real PostgreSQL server (:mod:`storage._pg_lease`).

Each test gets its own database (created and dropped here). Two connections
stand for two hosts; every lease step runs in a savepoint of a transaction,
as a PostgreSQL batch runs it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

asyncpg = pytest.importorskip("asyncpg")

from storage import Fence, FencedError, LeaseHeldError, LeaseUse, RecordedEvent  # noqa: E402
from storage._pg_lease import LEASE_SCHEMA, fence_records, use_lease  # noqa: E402

DSN = "postgresql://postgres@127.0.0.1:5432/{}"
SID = "ses_pg"


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    name = f"lease_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(DSN.format("postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        conn = await asyncpg.connect(DSN.format(name))
        try:
            await conn.execute(LEASE_SCHEMA)
        finally:
            await conn.close()
        yield DSN.format(name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def hosts(dsn: str) -> AsyncIterator[tuple[Any, Any]]:
    a, b = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def in_savepoint(conn: Any, use: LeaseUse) -> int:
    """One command's lease step, committed with its batch, or rolled back alone."""
    async with conn.transaction():
        savepoint = conn.transaction()
        await savepoint.start()
        try:
            epoch = await use_lease(conn, use)
        except Exception:
            await savepoint.rollback()
            raise
        await savepoint.commit()
        return epoch


async def test_takes_raise_the_epoch_and_a_live_lease_refuses_others(
    hosts: tuple[Any, Any],
) -> None:
    a, b = hosts
    assert await in_savepoint(a, LeaseUse.take(SID, "host-a", 10_000)) == 1
    with pytest.raises(LeaseHeldError) as caught:
        await in_savepoint(b, LeaseUse.take(SID, "host-b", 10_000))
    assert caught.value.owner == "host-a"
    assert await in_savepoint(a, LeaseUse.take(SID, "host-a", 10_000)) == 2
    await in_savepoint(a, Fence(SID, "host-a", 2).release())
    assert await in_savepoint(b, LeaseUse.take(SID, "host-b", 10_000)) == 3


async def test_a_stale_epoch_is_fenced_after_another_host_took_over(
    hosts: tuple[Any, Any],
) -> None:
    a, b = hosts
    stale = Fence(SID, "host-a", await in_savepoint(a, LeaseUse.take(SID, "host-a", 50)))
    await asyncio.sleep(0.1)
    with pytest.raises(FencedError, match="expired"):
        await in_savepoint(a, stale.hold())
    current = Fence(SID, "host-b", await in_savepoint(b, LeaseUse.take(SID, "host-b", 10_000)))
    with pytest.raises(FencedError, match="host-b holds epoch 2"):
        await in_savepoint(a, stale.hold())
    with pytest.raises(FencedError):
        await in_savepoint(a, stale.renew(10_000))
    assert await in_savepoint(b, current.hold()) == 2


async def test_renewal_keeps_a_lease_live(hosts: tuple[Any, Any]) -> None:
    a, b = hosts
    fence = Fence(SID, "host-a", await in_savepoint(a, LeaseUse.take(SID, "host-a", 200)))
    for _ in range(4):
        await asyncio.sleep(0.08)
        await in_savepoint(a, fence.renew(200))
    with pytest.raises(LeaseHeldError):
        await in_savepoint(b, LeaseUse.take(SID, "host-b", 200))


async def test_two_hosts_taking_at_once_one_wins(dsn: str) -> None:
    conns = [await asyncpg.connect(dsn) for _ in range(6)]
    try:
        outcomes = await asyncio.gather(
            *(
                in_savepoint(c, LeaseUse.take(SID, f"host-{i}", 10_000))
                for i, c in enumerate(conns)
            ),
            return_exceptions=True,
        )
    finally:
        for c in conns:
            await c.close()
    assert sorted(type(o).__name__ for o in outcomes) == ["LeaseHeldError"] * 5 + ["int"]
    assert [o for o in outcomes if isinstance(o, int)] == [1]


async def test_fenced_events_record_their_writer(hosts: tuple[Any, Any]) -> None:
    a, _ = hosts
    use = LeaseUse.take(SID, "host-a", 10_000)
    records = [
        RecordedEvent(
            position=p,
            id=f"evt_{p}",
            aggregate_id=agg,
            seq=p,
            type="t",
            created=0,
            data="{}",
            event=None,
        )
        for p, agg in ((7, SID), (8, "ses_other"))
    ]
    async with a.transaction():
        epoch = await use_lease(a, use)
        fenced = await fence_records(a, use, epoch, records)
    assert [r.epoch for r in fenced] == [1, None]
    rows = await a.fetch("SELECT position, session_id, host_id, epoch FROM event_fence")
    assert [tuple(r) for r in rows] == [(7, SID, "host-a", 1)]


async def test_two_postgres_stores_fence_a_stale_host(pg_url: str) -> None:
    """Through the store itself: two writers (two hosts) on one database."""
    from protocol import Location
    from protocol import events as ev
    from storage import Command, connect

    async with connect(pg_url) as a, connect(pg_url) as b:
        await a.append(
            Command.of(
                ev.SessionCreated(session_id=SID, title="t", location=Location(directory="/"))
            )
        )
        [started] = await a.append(
            Command.of(ev.ExecutionStarted(session_id=SID), lease=LeaseUse.take(SID, "host-a", 50))
        )
        assert started.epoch == 1
        stale = Fence(SID, "host-a", 1)
        await asyncio.sleep(0.1)
        [taken] = await b.append(
            Command.of(
                ev.ExecutionRecovering(session_id=SID, attempt=1),
                lease=LeaseUse.take(SID, "host-b", 10_000),
            )
        )
        assert taken.epoch == 2
        before = await a.last_seq(SID)
        with pytest.raises(FencedError):
            await a.append(
                Command.of(ev.SessionRenamed(session_id=SID, title="late"), lease=stale.hold())
            )
        assert await b.last_seq(SID) == before
        [claim] = await b.queries.claims()
        assert claim.lease is not None
        assert (claim.lease.host_id, claim.lease.epoch) == ("host-b", 2)
