"""Execution leases and fencing in the store (:mod:`storage.lease`)."""

from __future__ import annotations

import asyncio

import pytest

from protocol import Location
from protocol import events as ev
from storage import (
    Command,
    Fence,
    FencedError,
    LeaseHeldError,
    LeaseUse,
    SQLiteStore,
    fenced,
    now_ms,
)

SID = "ses_lease"


async def _session(store: SQLiteStore, sid: str = SID) -> None:
    await store.append(
        Command.of(ev.SessionCreated(session_id=sid, title="t", location=Location(directory="/")))
    )


async def _take(store: SQLiteStore, host: str, ttl_ms: int = 10_000) -> Fence:
    records = await store.append(
        Command.of(ev.ExecutionStarted(session_id=SID), lease=LeaseUse.take(SID, host, ttl_ms))
    )
    assert records[0].epoch is not None
    return Fence(SID, host, records[0].epoch)


def _step(fence: Fence) -> Command:
    return Command.of(ev.SessionRenamed(session_id=SID, title="step"), lease=fence.hold())


async def test_a_take_claims_and_leases_in_one_command(store: SQLiteStore) -> None:
    await _session(store)
    fence = await _take(store, "host-a")
    assert fence.epoch == 1
    [claim] = await store.queries.claims()
    assert claim.lease is not None
    assert (claim.lease.host_id, claim.lease.epoch) == ("host-a", 1)
    assert not claim.orphaned(now_ms())


async def test_a_live_lease_of_another_host_refuses_the_take(store: SQLiteStore) -> None:
    await _session(store)
    await _take(store, "host-a")
    before = await store.last_seq(SID)
    with pytest.raises(LeaseHeldError) as caught:
        await _take(store, "host-b")
    assert (caught.value.owner, caught.value.epoch) == ("host-a", 1)
    assert await store.last_seq(SID) == before  # the started event rolled back with it


async def test_each_take_raises_the_epoch(store: SQLiteStore) -> None:
    await _session(store)
    first = await _take(store, "host-a")
    again = await _take(store, "host-a")  # its own live lease: a new busy period
    await store.append(Command.of(ev.ExecutionSucceeded(session_id=SID), lease=again.release()))
    other = await _take(store, "host-b")  # released: taken at once
    assert (first.epoch, again.epoch, other.epoch) == (1, 2, 3)


async def test_a_stale_epoch_append_is_rejected(store: SQLiteStore) -> None:
    await _session(store)
    stale = await _take(store, "host-a", ttl_ms=30)
    await asyncio.sleep(0.06)
    current = await _take(store, "host-b")
    before = await store.last_seq(SID)
    with pytest.raises(FencedError) as caught:
        await store.append(_step(stale))
    assert caught.value.epoch == stale.epoch
    assert await store.last_seq(SID) == before
    await store.append(_step(current))
    assert await store.last_seq(SID) == before + 1


async def test_an_expired_lease_fences_even_before_anyone_takes_it(store: SQLiteStore) -> None:
    await _session(store)
    fence = await _take(store, "host-a", ttl_ms=30)
    await asyncio.sleep(0.06)
    with pytest.raises(FencedError, match="expired"):
        await store.append(_step(fence))
    [claim] = await store.queries.claims()
    assert claim.orphaned(now_ms())


async def test_renewal_keeps_the_lease_past_its_ttl(store: SQLiteStore) -> None:
    await _session(store)
    fence = await _take(store, "host-a", ttl_ms=150)
    for _ in range(4):
        await asyncio.sleep(0.05)
        await store.append(Command(events=(), lease=fence.renew(150)))
    await store.append(_step(fence))  # 200 ms after the take: still held
    with pytest.raises(LeaseHeldError):
        await _take(store, "host-b")


async def test_a_renewal_of_a_lost_lease_fails(store: SQLiteStore) -> None:
    await _session(store)
    stale = await _take(store, "host-a", ttl_ms=30)
    await asyncio.sleep(0.06)
    await _take(store, "host-b")
    with pytest.raises(FencedError):
        await store.append(Command(events=(), lease=stale.renew(10_000)))
    [lease] = await store.queries.leases()
    assert (lease.host_id, lease.epoch) == ("host-b", 2)


async def test_a_fenced_command_fails_alone_in_its_batch(store: SQLiteStore) -> None:
    await _session(store)
    await _session(store, "ses_other")
    stale = await _take(store, "host-a", ttl_ms=30)
    await asyncio.sleep(0.06)
    await _take(store, "host-b")
    # Submitted together: one batch, one transaction, a savepoint each.
    fenced = store.submit(_step(stale))
    fine = store.submit(Command.of(ev.SessionRenamed(session_id="ses_other", title="x")))
    with pytest.raises(FencedError):
        await fenced
    assert len(await fine) == 1


async def test_who_wrote_each_fenced_event_is_recorded(store: SQLiteStore) -> None:
    await _session(store)
    a = await _take(store, "host-a")
    [step] = await store.append(_step(a))
    await store.append(Command.of(ev.ExecutionSucceeded(session_id=SID), lease=a.release()))
    b = await _take(store, "host-b")
    rows = await store.fetch("SELECT position, host_id, epoch FROM event_fence ORDER BY position")
    assert [(r[1], r[2]) for r in rows] == [
        ("host-a", 1),
        ("host-a", 1),
        ("host-a", 1),
        ("host-b", 2),
    ]
    assert rows[1][0] == step.position
    assert b.epoch == 2
    # Released by the terminal, and the claim with it; the new take claims again.
    [claim] = await store.queries.claims()
    assert claim.lease is not None
    assert claim.lease.host_id == "host-b"


async def test_reopening_the_file_frees_the_dead_writers_leases(store: SQLiteStore) -> None:
    # One writer per SQLite file: a lease left live was its previous process's.
    if not isinstance(store, SQLiteStore):
        pytest.skip("several writers share a server database: its leases are waited out")
    await _session(store)
    await _take(store, "host-a")
    await store.close()
    async with SQLiteStore(store.path) as again:
        fence = await _take(again, "host-b")
        assert fence.epoch == 2  # the epoch survives; only the expiry is cleared
        [claim] = await again.queries.claims()
        assert claim.time_claimed is not None


async def test_appends_inside_fenced_hold_the_fence(store: SQLiteStore) -> None:
    await _session(store)
    await _session(store, "ses_other")
    stale = await _take(store, "host-a", ttl_ms=30)
    await asyncio.sleep(0.06)
    await _take(store, "host-b")
    with fenced(stale):
        with pytest.raises(FencedError):
            await store.append(Command.of(ev.SessionRenamed(session_id=SID, title="late")))

        async def child() -> None:
            await store.append(Command.of(ev.SessionRenamed(session_id=SID, title="later")))

        with pytest.raises(FencedError):
            await asyncio.create_task(child())
        # Another session's append is not the execution's: it is not fenced.
        await store.append(Command.of(ev.SessionRenamed(session_id="ses_other", title="ok")))
    await store.append(Command.of(ev.SessionRenamed(session_id=SID, title="admitted")))
