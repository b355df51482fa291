"""Execution leases and fencing in the store (:mod:`storage.lease`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from manual_clock import ManualClock

from actors.lease_keeper import LeaseKeeper
from protocol import Location
from protocol import events as ev
from storage import (
    AppendConflictError,
    Command,
    Fence,
    FencedError,
    LeaseHeldError,
    LeaseUse,
    RecordedEvent,
    SQLiteStore,
    fenced,
)
from storage._ops import Op
from storage.lease import use_lease
from storage.recorder import EntryWrite

SID = "ses_lease"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SQLiteStore]:
    """The log on SQLite with a clock the test advances: a lease expires when the test
    moves the clock past it, not when a real TTL runs out."""
    async with SQLiteStore(db_path, clock=ManualClock()) as s:
        yield s


def later(store: SQLiteStore, ms: int) -> None:
    """Move the writer's clock ``ms`` on."""
    clock = store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(ms)


async def _session(store: SQLiteStore, sid: str = SID) -> None:
    await store.append(
        Command.of(ev.SessionCreated(session_id=sid, title="t", location=Location(directory="/")))
    )


async def _take(store: SQLiteStore, host: str, ttl_ms: int = 10_000, *, sid: str = SID) -> Fence:
    records = await store.append(
        Command.of(ev.ExecutionStarted(session_id=sid), lease=LeaseUse.take(sid, host, ttl_ms))
    )
    assert records[0].epoch is not None
    return Fence(sid, host, records[0].epoch)


def _step(fence: Fence) -> Command:
    return Command.of(ev.SessionRenamed(session_id=SID, title="step"), lease=fence.hold())


# -- the rules (one pure function; both backends' writers call it) -----------------------------


def test_a_take_needs_no_row_an_expired_one_or_its_own_and_raises_the_epoch() -> None:
    take = LeaseUse.take(SID, "host-a", 500)
    assert use_lease(None, take, now=1_000) == (("host-a", 1, 1_500), 1)
    assert use_lease(("host-b", 4, 1_000), take, now=1_000) == (("host-a", 5, 1_500), 5)
    assert use_lease(("host-a", 4, 9_999), take, now=1_000) == (("host-a", 5, 1_500), 5)
    with pytest.raises(LeaseHeldError) as caught:
        use_lease(("host-b", 4, 1_001), take, now=1_000)
    assert (caught.value.owner, caught.value.epoch) == ("host-b", 4)


@pytest.mark.parametrize(
    ("row", "detail"),
    [
        (None, "no lease was taken"),
        (("host-b", 3, 9_000), "host host-b holds epoch 3"),
        (("host-a", 2, 9_000), "host host-a holds epoch 2"),
        (("host-a", 3, 1_000), "the lease expired"),
    ],
)
def test_every_other_use_needs_the_row_live_at_its_host_and_epoch(
    row: tuple[str, int, int] | None, detail: str
) -> None:
    fence = Fence(SID, "host-a", 3)
    for use in (fence.hold(), fence.renew(500), fence.release()):
        with pytest.raises(FencedError, match=detail):
            use_lease(row, use, now=1_000)


def test_hold_keeps_the_row_renew_moves_its_expiry_release_expires_it() -> None:
    fence, row = Fence(SID, "host-a", 3), ("host-a", 3, 1_001)
    assert use_lease(row, fence.hold(), now=1_000) == (row, 3)
    assert use_lease(row, fence.renew(500), now=1_000) == (("host-a", 3, 1_500), 3)
    assert use_lease(row, fence.release(), now=1_000) == (("host-a", 3, 0), 3)


async def test_a_take_claims_and_leases_in_one_command(store: SQLiteStore) -> None:
    await _session(store)
    fence = await _take(store, "host-a")
    assert fence.epoch == 1
    [claim] = await store.queries.claims()
    assert claim.lease is not None
    assert (claim.lease.host_id, claim.lease.epoch) == ("host-a", 1)
    assert not claim.orphaned(store.clock.now_ms())


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
    later(store, 60)
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
    later(store, 60)
    with pytest.raises(FencedError, match="expired"):
        await store.append(_step(fence))
    [claim] = await store.queries.claims()
    assert claim.orphaned(store.clock.now_ms())


async def test_renewal_keeps_the_lease_past_its_ttl(store: SQLiteStore) -> None:
    await _session(store)
    fence = await _take(store, "host-a", ttl_ms=150)
    for _ in range(4):
        later(store, 50)
        await store.append(Command(events=(), lease=fence.renew(150)))
    await store.append(_step(fence))  # 200 ms after the take: still held
    with pytest.raises(LeaseHeldError):
        await _take(store, "host-b")


async def test_a_renewal_of_a_lost_lease_fails(store: SQLiteStore) -> None:
    await _session(store)
    stale = await _take(store, "host-a", ttl_ms=30)
    later(store, 60)
    await _take(store, "host-b")
    with pytest.raises(FencedError):
        await store.append(Command(events=(), lease=stale.renew(10_000)))
    [lease] = await store.queries.leases()
    assert (lease.host_id, lease.epoch) == ("host-b", 2)


async def test_a_fenced_command_fails_alone_in_its_batch(store: SQLiteStore) -> None:
    await _session(store)
    await _session(store, "ses_other")
    stale = await _take(store, "host-a", ttl_ms=30)
    later(store, 60)
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
    later(store, 60)
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


def _renamed(fence: Fence, title: str) -> Command:
    return Command.of(
        ev.SessionRenamed(session_id=fence.session_id, title=title), lease=fence.hold()
    )


def _assert_next(
    records: list[RecordedEvent], position: int, seqs: dict[str, int], step: int
) -> None:
    """``records`` are ses_a, ses_b and ses_c's next events, at the next positions."""
    assert [r.position for r in records] == [position + 1, position + 2, position + 3]
    assert [(r.aggregate_id, r.seq) for r in records] == [
        (sid, seqs[sid] + step) for sid in ("ses_a", "ses_b", "ses_c")
    ]


async def test_a_mixed_batch_commits_the_good_commands_and_forgets_the_failed_ones(
    store: SQLiteStore,
) -> None:
    # Several sessions' fenced commands in one batch, with one stale epoch, one
    # projector conflict, a take and a renewal whose commands fail after the
    # lease was used: the others commit at consecutive positions and seqs, the
    # failed ones leave no event, fence row or lease change (on disk or in the
    # writer's memory), and the next batch carries on from there.
    for sid in ("ses_a", "ses_b", "ses_c", "ses_d"):
        await _session(store, sid)
    a = await _take(store, "host-a", sid="ses_a")
    b = await _take(store, "host-b", sid="ses_b")
    short = await _take(store, "host-d", ttl_ms=150, sid="ses_d")
    stale = await _take(store, "host-a", ttl_ms=30, sid="ses_c")
    later(store, 60)
    c = await _take(store, "host-c", sid="ses_c")
    seqs = {sid: await store.last_seq(sid) for sid in ("ses_a", "ses_b", "ses_c", "ses_d")}
    [last] = await store.fetch("SELECT max(position) FROM event")
    position = last[0]
    batches: list[int] = []
    store.batch_observers.append(lambda commands, _: batches.append(commands))

    missing = ev.InboxCancelled(session_id="ses_b", inbox_id="msg_none")
    futures = [
        store.submit(_renamed(a, "a1")),
        store.submit(_renamed(stale, "stale")),
        store.submit(_renamed(b, "b1")),
        # Projector conflicts: nothing is pending, and ses_x does not exist.
        store.submit(Command.of(missing, lease=b.hold())),
        store.submit(
            Command.of(
                ev.ExecutionStarted(session_id="ses_x"),
                lease=LeaseUse.take("ses_x", "host-x", 10_000),
            )
        ),
        store.submit(Command.of(missing, lease=short.renew(60_000))),
        store.submit(_renamed(c, "c1")),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    if isinstance(store, SQLiteStore):
        assert batches == [len(futures)]
    ok = [results[0], results[2], results[6]]
    assert all(isinstance(r, list) and len(r) == 1 for r in ok)
    assert isinstance(results[1], FencedError)
    for failed in (results[3], results[4], results[5]):
        assert isinstance(failed, AppendConflictError)
        assert not isinstance(failed, FencedError)
    records = [r[0] for r in ok if isinstance(r, list)]
    _assert_next(records, position, seqs, 1)
    assert [r.epoch for r in records] == [a.epoch, b.epoch, c.epoch]
    assert await store.last_seq("ses_x") == 0
    assert await store.last_seq("ses_d") == seqs["ses_d"]
    fences = await store.fetch(
        "SELECT position, session_id, host_id, epoch FROM event_fence WHERE position > ?"
        " ORDER BY position",
        (position,),
    )
    assert [tuple(f) for f in fences] == [
        (position + 1, "ses_a", "host-a", a.epoch),
        (position + 2, "ses_b", "host-b", b.epoch),
        (position + 3, "ses_c", "host-c", c.epoch),
    ]
    leases = {lease.session_id: lease for lease in await store.queries.leases()}
    assert "ses_x" not in leases  # the failed take left no row

    # The next batch gets the next seqs and positions, and fencing still holds:
    # the stale epoch, the take that never happened, and the renewal that
    # failed (the short lease has expired) are all rejected.
    later(store, 200)
    futures = [
        store.submit(_renamed(a, "a2")),
        store.submit(_renamed(stale, "stale again")),
        store.submit(_renamed(Fence("ses_x", "host-x", 1), "x")),
        store.submit(_renamed(short, "too late")),
        store.submit(_renamed(b, "b2")),
        store.submit(_renamed(c, "c2")),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[1], FencedError)
    assert isinstance(results[2], FencedError)
    assert "no lease" in str(results[2])
    assert isinstance(results[3], FencedError)
    assert "expired" in str(results[3])
    ok = [results[0], results[4], results[5]]
    records = [r[0] for r in ok if isinstance(r, list)]
    _assert_next(records, position + 3, seqs, 2)
    stored = await store.read_all(after=position)
    assert [(r.position, r.aggregate_id) for r in stored] == [
        (position + 1, "ses_a"),
        (position + 2, "ses_b"),
        (position + 3, "ses_c"),
        (position + 4, "ses_a"),
        (position + 5, "ses_b"),
        (position + 6, "ses_c"),
    ]


class LostLeases(list[str]):
    """The keeper's LeaseLoss, recording the sessions it reports."""

    def lease_lost(self, session_id: str) -> None:
        self.append(session_id)


async def test_a_renewal_outrun_by_the_next_execution_reports_nothing_lost(
    store: SQLiteStore,
) -> None:
    """The keeper lists a fence, the execution ends (release) and the next one
    takes the lease before the renewal commits: the renewal fails, yet the
    lease held now is live and must not be reported lost."""
    await _session(store)
    lost = LostLeases()
    keeper = LeaseKeeper(store, "host-a", ttl_ms=10_000, on_lost=lost)
    first = await _take(store, "host-a")
    keeper.hold(SID, first.epoch)
    await store.append(Command.of(ev.ExecutionSucceeded(session_id=SID), lease=first.release()))
    renewal = asyncio.get_running_loop().create_task(keeper.renew())
    await asyncio.sleep(0)  # the renewal has listed ``first`` and submitted it
    second = await _take(store, "host-a")
    keeper.hold(SID, second.epoch)
    assert await renewal == []
    assert lost == []
    assert keeper.fence(SID) == second
    await store.append(_step(second))  # the new execution still writes


async def test_a_renewal_that_finds_its_lease_taken_reports_it_lost(store: SQLiteStore) -> None:
    await _session(store)
    lost = LostLeases()
    keeper = LeaseKeeper(store, "host-a", ttl_ms=10_000, on_lost=lost)
    stale = await _take(store, "host-a", ttl_ms=30)
    keeper.hold(SID, stale.epoch)
    later(store, 60)
    await _take(store, "host-b")
    assert await keeper.renew() == [SID]
    assert lost == [SID]
    assert keeper.fence(SID) is None


async def test_the_keeper_renews_each_quarter_ttl_on_its_clock(store: SQLiteStore) -> None:
    """No renewal before a quarter of the TTL has passed on the keeper's clock; one
    once it has, moving the expiry a TTL past that moment."""
    clock = store.clock
    assert isinstance(clock, ManualClock)
    await _session(store)
    fence = await _take(store, "host-a", ttl_ms=1_000)
    [taken] = await store.queries.leases()
    keeper = LeaseKeeper(store, "host-a", ttl_ms=1_000, on_lost=LostLeases(), clock=clock)
    keeper.hold(SID, fence.epoch)
    committed = asyncio.Event()
    store.batch_observers.append(lambda _commands, _seconds: committed.set())
    await keeper.start()
    try:
        async with asyncio.timeout(10):
            await clock.until_sleeping()  # the renewal task waits on the clock
            assert clock.advance(249) == 0  # not yet due
            assert clock.advance(1) == 1
            await committed.wait()  # the renewal's batch
        [renewed] = await store.queries.leases()
        assert renewed.expires == taken.expires + 250
        assert renewed.live(taken.expires + 100)  # would have expired without it
    finally:
        await keeper.aclose()


def test_with_lease_keeps_every_other_field_of_the_command() -> None:
    """with_lease copies the fields by name (for speed); a field added to
    Command and not to it would be dropped silently, so this lists them."""
    names = {f.name for f in attrs.fields(Command)}
    assert names == {"events", "expected", "blobs", "entries", "lease", "checks"}
    command = Command(
        events=Command.of(ev.SessionRenamed(session_id=SID, title="t")).events,
        expected={SID: 3},
        blobs={"ab" * 32: "{}"},
        entries=(EntryWrite(session_id=SID, key="k", value="1", time=5),),
        lease=None,
        checks=(Op("UPDATE session SET title = title WHERE id = ?", (SID,), expect=1),),
    )
    use = LeaseUse(kind="hold", session_id=SID, host_id="h", epoch=2)
    assert command.with_lease(use) == attrs.evolve(command, lease=use)


async def test_a_batch_of_more_fenced_events_than_one_statement_takes_records_each(
    store: SQLiteStore,
) -> None:
    """The writer inserts a batch's fence rows together, several hundred per
    statement: every fenced event still gets its own row, and no other does."""
    await _session(store)
    await _session(store, "ses_free")
    a = await _take(store, "host-a")
    [last] = await store.fetch("SELECT max(position) FROM event")
    position = last[0]
    futures = []
    for i in range(700):
        renamed = ev.SessionRenamed(session_id=SID, title=f"t{i}")
        if i % 100 == 7:  # one command of three events, two of them fenced
            free = ev.SessionRenamed(session_id="ses_free", title=f"f{i}")
            futures.append(store.submit(Command.of(renamed, free, renamed, lease=a.hold())))
        else:
            futures.append(store.submit(Command.of(renamed, lease=a.hold())))
    results = await asyncio.gather(*futures)
    fenced = [r.position for records in results for r in records if r.aggregate_id == SID]
    assert len(fenced) == 700 + 7
    rows = await store.fetch(
        "SELECT position, session_id, host_id, epoch FROM event_fence WHERE position > ?"
        " ORDER BY position",
        (position,),
    )
    assert [r[0] for r in rows] == fenced
    assert {(r[1], r[2], r[3]) for r in rows} == {(SID, "host-a", a.epoch)}
