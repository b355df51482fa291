"""Leases and fencing on a real PostgreSQL server, through stores standing for hosts.

The rules are :func:`storage.lease.use_lease` (tests/storage/test_lease.py
holds them to each case); here, that PostgreSQL's writer applies them to the
rows it reads under the batch lock, with the server's clock, so hosts on one
database agree. A ttl of 0 is a lease already expired: no test waits for one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from protocol import Location
from protocol import events as ev
from storage import Command, Fence, FencedError, LeaseHeldError, LeaseUse, Store, connect

SID = "ses_pg"


@pytest.fixture
async def hosts(pg_url: str) -> AsyncIterator[tuple[Store, Store]]:
    async with connect(pg_url) as a, connect(pg_url) as b:
        await a.append(
            Command.of(
                ev.SessionCreated(session_id=SID, title="t", location=Location(directory="/"))
            )
        )
        yield a, b


async def use(store: Store, lease: LeaseUse, *events: ev.Event) -> int:
    """The epoch ``lease`` holds once committed (with ``events``, if any)."""
    command = Command.of(*events, lease=lease) if events else Command(events=(), lease=lease)
    records = await store.append(command)
    return lease.epoch if not records else int(records[0].epoch or 0)


def started() -> ev.ExecutionStarted:
    return ev.ExecutionStarted(session_id=SID)


async def test_takes_raise_the_epoch_and_a_live_lease_refuses_others(
    hosts: tuple[Store, Store],
) -> None:
    a, b = hosts
    assert await use(a, LeaseUse.take(SID, "host-a", 60_000), started()) == 1
    with pytest.raises(LeaseHeldError) as caught:
        await use(b, LeaseUse.take(SID, "host-b", 60_000), started())
    assert (caught.value.owner, caught.value.epoch) == ("host-a", 1)
    assert await use(a, LeaseUse.take(SID, "host-a", 60_000), started()) == 2
    await use(a, Fence(SID, "host-a", 2).release())
    assert await use(b, LeaseUse.take(SID, "host-b", 60_000), started()) == 3


async def test_a_stale_epoch_is_fenced_once_expired_and_after_another_host_took_over(
    hosts: tuple[Store, Store],
) -> None:
    a, b = hosts
    stale = Fence(SID, "host-a", await use(a, LeaseUse.take(SID, "host-a", 0), started()))
    with pytest.raises(FencedError, match="expired"):
        await use(a, stale.hold(), ev.SessionRenamed(session_id=SID, title="late"))
    current = Fence(SID, "host-b", await use(b, LeaseUse.take(SID, "host-b", 60_000), started()))
    with pytest.raises(FencedError, match="host-b holds epoch 2"):
        await use(a, stale.hold(), ev.SessionRenamed(session_id=SID, title="late"))
    with pytest.raises(FencedError):
        await use(a, stale.renew(60_000))
    assert await use(b, current.hold(), ev.SessionRenamed(session_id=SID, title="b")) == 2
    assert [r.event.title for r in await b.read(SID) if isinstance(r.event, ev.SessionRenamed)] == [
        "b"
    ]


async def test_a_renewal_moves_the_expiry_on_the_servers_clock(
    hosts: tuple[Store, Store],
) -> None:
    a, b = hosts
    fence = Fence(SID, "host-a", await use(a, LeaseUse.take(SID, "host-a", 1_000), started()))
    [before] = await a.queries.leases()
    await use(a, fence.renew(3_600_000))
    [after] = await b.queries.leases()
    assert (after.host_id, after.epoch) == ("host-a", 1)
    assert after.expires >= before.expires + 3_599_000
    with pytest.raises(LeaseHeldError):
        await use(b, LeaseUse.take(SID, "host-b", 60_000), started())


async def test_hosts_taking_at_once_leave_one_winner(pg_url: str, hosts: Any) -> None:
    stores = [connect(pg_url) for _ in range(4)]
    for store in stores:
        await store.open()
    try:
        outcomes = await asyncio.gather(
            *(
                use(store, LeaseUse.take(SID, f"host-{i}", 60_000), started())
                for i, store in enumerate(stores)
            ),
            return_exceptions=True,
        )
    finally:
        for store in stores:
            await store.close()
    assert sorted(type(o).__name__ for o in outcomes) == ["LeaseHeldError"] * 3 + ["int"]
    assert [o for o in outcomes if isinstance(o, int)] == [1]


async def test_fenced_events_record_their_writer_and_carry_its_epoch(
    hosts: tuple[Store, Store],
) -> None:
    a, _ = hosts
    await a.append(
        Command.of(
            ev.SessionCreated(session_id="ses_other", title="t", location=Location(directory="/"))
        )
    )
    epoch = await use(a, LeaseUse.take(SID, "host-a", 60_000), started())
    records = await a.append(
        Command.of(
            ev.SessionRenamed(session_id=SID, title="mine"),
            ev.SessionRenamed(session_id="ses_other", title="not fenced"),
            lease=Fence(SID, "host-a", epoch).hold(),
        )
    )
    assert [(r.aggregate_id, r.epoch) for r in records] == [(SID, 1), ("ses_other", None)]
    rows = await a.fetch(
        "SELECT e.aggregate_id, e.seq, f.host_id, f.epoch FROM event_fence f"
        " JOIN event e ON e.position = f.position ORDER BY e.position"
    )
    assert rows == [(SID, 2, "host-a", 1), (SID, 3, "host-a", 1)]
