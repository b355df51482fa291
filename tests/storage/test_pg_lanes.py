"""The PostgreSQL store's writer lanes: two batches in flight, and nothing overtakes.

The selection (:func:`storage.postgres._lanes.take`) is tested on its own;
the store tests hold the batch lock from a connection of their own, so
every batch the store sends waits on the server where the test can see it
(``pg_stat_activity``), then let go and read what committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import attrs
import pytest

from protocol import Location
from protocol import events as ev
from storage import Command, RecordedEvent
from storage.batch import Prepared, keys
from storage.lease import LeaseUse
from storage.postgres import LOG_LOCK, PostgresStore
from storage.postgres._lanes import MAX_SHARE, SPLIT_AT, Share, take
from storage.postgres.remote import CommitGate, RemoteCommits
from storage.recorder import EntryWrite


def created(session_id: str, parent: str | None = None) -> ev.SessionCreated:
    return ev.SessionCreated(
        session_id=session_id, title="t", location=Location(directory="/"), parent_id=parent
    )


def renamed(session_id: str, title: str) -> ev.SessionRenamed:
    return ev.SessionRenamed(session_id=session_id, title=title)


def prepared(command: Command) -> tuple[Prepared, str]:
    title = getattr(command.events[0].event, "title", "") if command.events else ""
    return Prepared(command=command, encoded=()), title


# -- the selection ------------------------------------------------------------------------------


def test_keys_name_every_session_a_command_orders_against() -> None:
    command = Command.of(created("ses_child", parent="ses_parent"))
    assert keys(prepared(command)[0]) == {"ses_child", "ses_parent"}
    held = Command.of(
        renamed("ses_a", "x"), lease=LeaseUse(kind="hold", session_id="ses_b", host_id="h", epoch=3)
    )
    assert keys(prepared(held)[0]) == {"ses_a", "ses_b"}
    # One event, and a session it only expects or writes an entry of.
    expecting = Command.of(renamed("ses_a", "x"), expected={"ses_c": 2})
    assert keys(prepared(expecting)[0]) == {"ses_a", "ses_c"}
    entry = EntryWrite(session_id="ses_d", key="k", value='"v"')
    writing = attrs.evolve(Command.of(renamed("ses_a", "x")), entries=(entry,))
    assert keys(prepared(writing)[0]) == {"ses_a", "ses_d"}


def test_a_share_is_the_outstanding_commands_over_the_lanes_and_forgets_slowly() -> None:
    share = Share(2)
    assert share.seen(SPLIT_AT - 1) == MAX_SHARE  # too few to split
    assert share.seen(100) == 50
    # Half the producers answered and not yet back: the estimate barely moves
    # (90 of the 100 seen, not the 50 visible now).
    assert share.seen(50) == 45
    for _ in range(60):
        last = share.seen(20)
    assert last == 10  # a lasting drop is followed
    assert Share(1).seen(100) == MAX_SHARE


def test_with_nothing_in_flight_a_lane_takes_its_share_and_leaves_the_rest() -> None:
    pending = [prepared(Command.of(renamed(f"ses_{i}", str(i)))) for i in range(SPLIT_AT * 2)]
    batch, rest, held = take(pending, [], share=SPLIT_AT)
    assert [t for _, t in batch] == [str(i) for i in range(SPLIT_AT)]
    assert [t for _, t in rest] == [str(i) for i in range(SPLIT_AT, SPLIT_AT * 2)]
    assert held == {f"ses_{i}" for i in range(SPLIT_AT)}
    assert len(take(pending, [], share=MAX_SHARE)[0]) == SPLIT_AT * 2


def test_a_command_never_overtakes_one_in_flight_or_pending_on_its_keys() -> None:
    pending = [
        prepared(Command.of(renamed("ses_busy", "a"))),  # its session is in flight
        prepared(Command.of(renamed("ses_free", "b"))),
        prepared(Command.of(created("ses_fork", parent="ses_busy"))),  # names the busy one
        prepared(Command.of(renamed("ses_fork", "c"))),  # behind the held-back fork
        prepared(Command.of(renamed("ses_free", "d"))),
    ]
    batch, rest, held = take(pending, [(frozenset({"ses_busy"}), 1)], share=MAX_SHARE)
    assert [t for _, t in batch] == ["b", "d"]
    assert [t for _, t in rest] == ["a", "t", "c"]
    assert held == {"ses_free"}


def test_a_lane_waits_while_fewer_than_a_share_or_than_in_flight_are_pending() -> None:
    pending = [prepared(Command.of(renamed(f"ses_{i}", str(i)))) for i in range(3)]
    busy = [(frozenset({"ses_x"}), 4)]
    batch, rest, _ = take(pending, busy, share=MAX_SHARE)
    assert batch == []
    assert rest == pending
    assert len(take(pending, [(frozenset({"ses_x"}), 3)], share=MAX_SHARE)[0]) == 3
    assert len(take(pending, busy, share=3)[0]) == 3  # a share is there
    batch, rest, _ = take(pending, busy, share=2)
    assert [t for _, t in batch] == ["0", "1"]
    assert [t for _, t in rest] == ["2"]


# -- the gate and the owned ranges -----------------------------------------------------------


async def test_a_catch_up_waits_for_running_commits_and_holds_new_ones() -> None:
    gate = CommitGate()
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def commit(name: str, hold: asyncio.Event | None = None) -> None:
        async with gate.commit():
            order.append(f"{name} in")
            if hold is not None:
                first_in.set()
                await hold.wait()
            order.append(f"{name} out")

    async def catch_up() -> None:
        async with gate.catch_up():
            order.append("catch-up")

    first = asyncio.create_task(commit("one", release_first))
    await first_in.wait()
    reading = asyncio.create_task(catch_up())
    await asyncio.sleep(0)
    second = asyncio.create_task(commit("two"))
    await asyncio.sleep(0)
    assert order == ["one in"]  # the catch-up waits for one; two waits for the catch-up
    release_first.set()
    await asyncio.gather(first, reading, second)
    assert order == ["one in", "one out", "catch-up", "two in", "two out"]


async def test_owned_ranges_told_out_of_order_are_still_skipped() -> None:
    async def fetch(sql: str, params: object = ()) -> list[object]:
        return []

    remote = RemoteCommits(fetch, lambda records: None)
    remote.own(1, 10)
    remote.own(21, 30)
    remote.own(11, 20)  # the lane that took 11..20 heard its answer last
    assert all(remote._is_own(p) for p in range(1, 31))
    assert not remote._is_own(31)


# -- the store ----------------------------------------------------------------------------------


@pytest.fixture
async def outsider(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own, to hold the batch lock (session-level) with."""
    conn = await asyncpg.connect(pg_url)
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def lock_held(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """The batch lock held by ``conn`` inside the block (let go even when it fails, so
    the store's close does not wait on batches stuck behind it)."""
    await conn.execute("SELECT pg_advisory_lock($1)", LOG_LOCK)
    try:
        yield
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", LOG_LOCK)


async def _waiting_on_the_lock(conn: asyncpg.Connection, count: int) -> None:
    async with asyncio.timeout(10):  # a guard, not the synchronisation
        while (  # noqa: ASYNC110 (the server's view, not an event)
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            )
            < count
        ):
            await asyncio.sleep(0.02)


async def test_two_lanes_put_two_batches_on_the_server_and_nothing_overtakes(
    pg_url: str, outsider: asyncpg.Connection
) -> None:
    sessions = [f"ses_{i:02d}" for i in range(SPLIT_AT * 2)]
    async with PostgresStore(pg_url, writers=2) as store:
        await asyncio.gather(*(store.append(Command.of(created(s))) for s in sessions))
        async with lock_held(outsider):
            first = [store.submit(Command.of(renamed(s, "first"))) for s in sessions]
            await _waiting_on_the_lock(outsider, 2)  # both lanes sent a batch: 16 and 16
            # Behind a batch in flight: ses_00 must wait for its first rename;
            # ses_new shares no key with anything in flight but waits for room.
            again = store.submit(Command.of(renamed(sessions[0], "second")))
            fresh = store.submit(Command.of(created("ses_new")))
            await asyncio.sleep(0.1)
            assert not again.done()
            assert not fresh.done()
        records: list[list[RecordedEvent]] = await asyncio.gather(*first, again, fresh)
        assert store.batch_paths["plain"] >= 3
        for s in sessions:
            titles = [(r.seq, r.event.title) for r in await store.read(s)]
            want = [(1, "t"), (2, "first")] + ([(3, "second")] if s == sessions[0] else [])
            assert titles == want
        assert records[-2][0].position > records[0][0].position
        everything = await store.read_all(limit=1000)
        positions = [r.position for r in everything]
        assert positions == sorted(positions)
        assert len(set(positions)) == len(positions)
        assert len(everything) == 2 * len(sessions) + 2


async def test_one_lane_still_commits_in_submission_order(pg_url: str) -> None:
    async with PostgresStore(pg_url, writers=1) as store:
        await store.append(Command.of(created("ses_a")))
        results = await asyncio.gather(
            *(store.append(Command.of(renamed("ses_a", str(i)))) for i in range(40))
        )
        assert [r[0].seq for r in results] == list(range(2, 42))
        with pytest.raises(ValueError, match="at least one writer"):
            PostgresStore(pg_url, writers=0)


async def test_a_free_lane_leaves_a_command_behind_its_sessions_batch_in_flight(
    pg_url: str, outsider: asyncpg.Connection
) -> None:
    async with PostgresStore(pg_url, writers=2) as store:
        await asyncio.gather(*(store.append(Command.of(created(s))) for s in ("ses_a", "ses_b")))
        async with lock_held(outsider):
            one = store.submit(Command.of(renamed("ses_a", "one")))
            await _waiting_on_the_lock(outsider, 1)
            behind = Command.of(renamed("ses_a", "two"))
            two = store.submit(behind)
            other = store.submit(Command.of(renamed("ses_b", "other")))
            await _waiting_on_the_lock(outsider, 2)  # the free lane sent ses_b's rename alone
            assert [p.command for p, _ in store._pending] == [behind]
        await asyncio.gather(one, two, other)
        assert [r.event.title for r in await store.read("ses_a")] == ["t", "one", "two"]
        assert [r.event.title for r in await store.read("ses_b")] == ["t", "other"]
