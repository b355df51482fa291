"""What only the PostgreSQL store promises: several processes on one database.

Two stores on one database stand for two hosts (each has its own origin,
writer connection and LISTEN connection). The recorder contract and the
replay test run on PostgreSQL too; this module is about what crosses
between writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import attrs
import pytest
from pgdb import SERVER

from protocol import Location
from protocol import events as ev
from storage import (
    AppendConflictError,
    Command,
    NewEvent,
    RecordedEvent,
    StorageBrokenError,
    connect,
)
from storage.follow import FollowDispatcher
from storage.postgres import CHANNEL, LOG_LOCK, PostgresStore, listeners
from storage.postgres.listeners import register
from storage.postgres.notify import MAX_PAYLOAD, Notice, parse, payloads


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


def _record(position: int) -> RecordedEvent:
    return RecordedEvent(
        position=position,
        id=f"evt_{position}",
        aggregate_id="ses_a",
        seq=position,
        type="session.renamed.1",
        created=0,
        data="{}",
        event=None,
    )


def renamed(session_id: str, title: str) -> ev.SessionRenamed:
    return ev.SessionRenamed(session_id=session_id, title=title)


@pytest.fixture
async def two(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    a, b = connect(pg_url), connect(pg_url)  # what a runtime with this database opens
    assert isinstance(a, PostgresStore)
    assert isinstance(b, PostgresStore)
    async with a, b:
        yield a, b


class Heard:
    """A subscriber that records what it hears and wakes whoever waits for a count."""

    def __init__(self, store: PostgresStore) -> None:
        self.records: list[RecordedEvent] = []
        self._grew = asyncio.Event()
        store.subscribe(self)

    def __call__(self, records: Any) -> None:
        self.records.extend(records)
        self._grew.set()

    def __len__(self) -> int:
        return len(self.records)

    async def reach(self, n: int) -> None:
        async with asyncio.timeout(10):  # a guard, not the synchronisation
            while len(self.records) < n:
                self._grew.clear()
                await self._grew.wait()


async def test_a_follower_on_one_host_sees_commits_made_on_another(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    await a.append(Command.of(created("ses_a")))
    async with FollowDispatcher(b).follow("ses_a", follow=True) as follow:
        replayed = [r async for page in follow.replay() for r in page]
        assert [r.seq for r in replayed] == [1]
        changes = follow.changes(idle_s=30)
        committed = await a.append(Command.of(renamed("ses_a", "x"), renamed("ses_a", "y")))
        page = await anext(changes)
        await changes.aclose()
    assert page == committed


async def test_subscribers_hear_other_hosts_once_and_their_own_host_directly(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    heard_by_b = Heard(b)
    from_a = await a.append(Command.of(created("ses_a")))
    from_b = await b.append(Command.of(created("ses_b")))
    assert heard_by_b.records[-1:] == from_b  # its own commit, at once
    await heard_by_b.reach(2)
    await a.append(Command.of(renamed("ses_a", "last")))
    await heard_by_b.reach(3)
    assert from_a[0] in heard_by_b.records
    assert len({r.id for r in heard_by_b.records}) == len(heard_by_b) == 3


async def test_concurrent_appends_from_two_hosts_to_one_session_never_gap(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    await a.append(Command.of(created("ses_s")))
    results = await asyncio.gather(
        *((a if i % 2 else b).append(Command.of(renamed("ses_s", str(i)))) for i in range(200))
    )
    assert sorted(r.seq for [r] in results) == list(range(2, 202))
    log = await b.read("ses_s", limit=1000)
    assert [r.seq for r in log] == list(range(1, 202))
    # Position order is commit order: the session's seqs rise along it.
    everything = await a.read_all(limit=1000)
    assert [r.seq for r in everything] == list(range(1, 202))


async def test_expected_seq_is_checked_across_hosts(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    await a.append(Command.of(created("ses_s"), expected={"ses_s": 0}))
    outcomes = await asyncio.gather(
        a.append(Command.of(renamed("ses_s", "a"), expected={"ses_s": 1})),
        b.append(Command.of(renamed("ses_s", "b"), expected={"ses_s": 1})),
        return_exceptions=True,
    )
    assert sum(isinstance(o, AppendConflictError) for o in outcomes) == 1
    assert await b.last_seq("ses_s") == 2


async def test_a_dropped_listen_connection_reconnects_and_nothing_is_missed(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    heard = Heard(b)
    await a.append(Command.of(created("ses_a")))
    await heard.reach(1)
    admin = await asyncpg.connect(a._url)
    try:
        # The server ends B's LISTEN session, as a failover or a restart would.
        pid = b.listener._conn.get_server_pid()
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    # Commits while B may not be listening: announced to nobody, read back by the catch-up.
    missed = [await a.append(Command.of(renamed("ses_a", str(i)))) for i in range(5)]
    await heard.reach(6)
    assert b.listener.connects == 2
    assert [r.id for r in heard.records[1:]] == [r.id for [r] in missed]
    await a.append(Command.of(renamed("ses_a", "after")))
    await heard.reach(7)
    assert len(heard) == 7


async def test_a_read_the_server_cuts_off_fails_as_storage_broken_then_reads_work(
    pg_url: str,
) -> None:
    """A restart or failover ends every session with 57P01 ("terminating
    connection due to administrator command"): a read in flight then fails as
    StorageBrokenError (a 503 at the front door, not a 500), and the next read
    gets a new connection."""
    async with PostgresStore(pg_url, readers=2) as store:
        await store.append(Command.of(created("ses_r")))
        slow = asyncio.ensure_future(store.fetch("SELECT pg_sleep(30)"))
        many = asyncio.ensure_future(
            store.fetch_many([("SELECT 1", ()), ("SELECT pg_sleep(30)", ())])
        )
        admin = await asyncpg.connect(pg_url)
        try:
            for _ in range(500):  # the server's view: both reads under way
                running = await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE query LIKE 'SELECT pg_sleep(30)%' AND pid <> pg_backend_pid()"
                )
                if running >= 2:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the reads never reached the server")
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        for read in (slow, many):
            with pytest.raises(StorageBrokenError, match="read failed"):
                await read
        assert await store.last_seq("ses_r") == 1


@pytest.mark.parametrize(
    "failure",
    [
        asyncpg.InternalClientError("cannot switch to state 12; another operation is in progress"),
        RuntimeError("a failure nothing names"),
    ],
    ids=["driver-state", "unforeseen"],
)
async def test_a_batch_that_fails_in_an_unforeseen_way_fails_its_appenders_and_the_lane_goes_on(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    """A writer lane whose commit raised what it did not name died, and the
    batch's appenders waited for ever (under crashsim's connection drops the
    driver raised InternalClientError). Now the batch fails as
    StorageBrokenError, the lane's connection is replaced, and writes go on."""
    from storage.postgres import store as store_module

    real = store_module.commit_batch
    calls = 0

    async def failing_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise failure
        return await real(*args, **kwargs)

    monkeypatch.setattr(store_module, "commit_batch", failing_once)
    async with PostgresStore(pg_url) as store:
        async with asyncio.timeout(10):
            with pytest.raises(StorageBrokenError, match="commit failed"):
                await store.append(Command.of(created("ses_w")))
            for _ in range(4):  # on a working connection
                await store.append(Command.of(created(f"ses_{_}")))
        assert await store.last_seq("ses_w") == 0
        assert await store.last_seq("ses_3") == 1


async def test_a_batch_touching_many_sessions_is_announced_in_several_payloads(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    heard = Heard(b)
    ids = [f"ses_{i:04d}_{'x' * 40}" for i in range(400)]
    committed = await asyncio.gather(*(a.append(Command.of(created(s))) for s in ids))
    await heard.reach(400)
    assert sorted(r.id for r in heard.records) == sorted(r.id for [r] in committed)
    records = [r for [r] in committed]
    chunks = payloads(a.origin, records)
    assert len(chunks) > 1
    assert all(len(c.encode()) < MAX_PAYLOAD for c in chunks)
    notices = [parse(c) for c in chunks]
    assert {agg for n in notices if n for agg, _ in n.heads} == set(ids)


class Listening:
    """A bare LISTEN connection on the log's channel, as another host's would be."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.notices: list[Notice] = []
        self._grew = asyncio.Event()

    @classmethod
    async def on(cls, url: str) -> Listening:
        listening = cls(await asyncpg.connect(url))
        await listening.conn.add_listener(CHANNEL, listening._heard)
        return listening

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        notice = parse(payload)
        assert notice is not None
        self.notices.append(notice)
        self._grew.set()

    async def reach(self, n: int) -> None:
        async with asyncio.timeout(10):  # a guard, not the synchronisation
            while len(self.notices) < n:
                self._grew.clear()
                await self._grew.wait()


async def _listed(conn: asyncpg.Connection) -> dict[str, int | None]:
    return dict(await conn.fetch("SELECT origin, pid FROM log_listener"))


async def test_a_store_alone_notifies_nobody_and_notifies_a_listener_once_it_is_listed(
    pg_url: str,
) -> None:
    other = await Listening.on(pg_url)
    try:
        async with PostgresStore(pg_url) as store:
            await store.append(Command.of(created("ses_a")))  # only its own listener listed
            await register(other.conn, "other-host", lock=LOG_LOCK)
            [second] = await store.append(Command.of(renamed("ses_a", "x")))
            await other.reach(1)
            # Notices arrive in commit order: had the first batch sent one, it
            # would be here before the second's.
            assert [(n.origin, n.first, n.last) for n in other.notices] == [
                (store.origin, second.position, second.position)
            ]
            assert store.batch_paths == {"plain": 2, "isolated": 0}
    finally:
        await other.conn.close()


async def test_a_host_of_an_earlier_build_is_notified_while_it_is_heard_from(
    pg_url: str,
) -> None:
    """Hosts of builds before schema v15 listen without a row: a store that
    hears one writes a row for it, which lasts a while after its last notice."""
    other = await Listening.on(pg_url)  # the earlier build's listener: no row
    try:
        async with PostgresStore(pg_url) as store:
            [first] = await store.append(Command.of(created("ses_a")))
            await other.conn.execute(  # long expired: counts for nothing
                "INSERT INTO log_listener (origin, pid, expires) VALUES ('gone', NULL, 1)"
            )
            await store.append(Command.of(renamed("ses_a", "x")))
            # The earlier build commits, and its notice says so, as every batch's did.
            await other.conn.execute(
                "SELECT pg_notify($1, $2)", CHANNEL, f"v1 earlier 1 {first.position}\nses_a 1"
            )
            async with asyncio.timeout(10):
                while not await other.conn.fetchval(  # noqa: ASYNC110 (the database's view)
                    "SELECT expires FROM log_listener WHERE origin = 'earlier' AND pid IS NULL"
                ):
                    await asyncio.sleep(0.01)
            [third] = await store.append(Command.of(renamed("ses_a", "y")))
            await other.reach(2)
            assert [(n.origin, n.first) for n in other.notices] == [
                ("earlier", 1),  # its own, heard back
                (store.origin, third.position),
            ]
    finally:
        await other.conn.close()


async def test_origins_heard_are_looked_up_once_within_their_bounds(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listeners, "MAX_UNHEARD", 2)
    monkeypatch.setattr(listeners, "MAX_ORIGINS", 3)
    conn = await asyncpg.connect(pg_url)
    looked_up: list[str] = []
    progress = asyncio.Event()

    async def fetchval(sql: str, origin: str, ttl: int) -> Any:
        value = await conn.fetchval(sql, origin, ttl)
        looked_up.append(origin)
        progress.set()
        return value

    async def until(count: int) -> None:
        async with asyncio.timeout(10):  # a guard, not the synchronisation
            while len(looked_up) < count:
                progress.clear()
                await progress.wait()

    origins = listeners.Origins(fetchval)
    task = asyncio.create_task(origins.look_up())
    try:
        await register(conn, "listed", lock=LOG_LOCK)
        origins.heard("listed")
        await until(1)
        for origin in ("earlier-1", "earlier-2", "earlier-3"):
            origins.heard(origin)  # the queue holds two: the third waits for its next notice
        await until(3)
        assert sorted(looked_up[1:]) == ["earlier-1", "earlier-2"]
        for origin in ("listed", "earlier-1", "earlier-3"):
            origins.heard(origin)  # known ones are not looked up again
        await until(4)
        assert looked_up[3:] == ["earlier-3"]
        rows = dict(await conn.fetch("SELECT origin, pid IS NULL FROM log_listener"))
        assert rows == {"listed": False, "earlier-1": True, "earlier-2": True, "earlier-3": True}
        origins.heard("listed")  # four looked up, three remembered: the first one went
        await until(5)
        assert looked_up[4:] == ["listed"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await conn.close()


async def test_a_store_lists_its_listen_connection_again_after_losing_it_and_unlists_it_at_close(
    pg_url: str,
) -> None:
    admin = await asyncpg.connect(pg_url)
    try:
        async with PostgresStore(pg_url) as store:
            first = store.listener.server_pid
            assert await _listed(admin) == {store.origin: first}
            await admin.execute("SELECT pg_terminate_backend($1)", first)
            async with asyncio.timeout(10):
                while (await _listed(admin)).get(store.origin) == first:  # noqa: ASYNC110 (the database's view)
                    await asyncio.sleep(0.01)
            second = store.listener.server_pid
            assert store.listener.connects == 2
            assert second not in (None, first)
            assert await _listed(admin) == {store.origin: second}
        assert await _listed(admin) == {}
    finally:
        await admin.close()


async def test_listing_a_store_deletes_the_rows_of_listeners_gone_or_expired(
    pg_url: str,
) -> None:
    admin = await asyncpg.connect(pg_url)
    gone = await asyncpg.connect(pg_url)
    try:
        gone_pid = gone.get_server_pid()
        await admin.execute(
            "INSERT INTO log_listener (origin, pid, expires) VALUES ('crashed', $1, NULL),"
            " ('alive', $2, NULL), ('earlier, silent', NULL, 1), ('earlier', NULL, $3)",
            gone_pid,
            admin.get_server_pid(),
            (1 << 62),
        )
        await gone.close()
        async with asyncio.timeout(10):
            while await admin.fetchval(  # noqa: ASYNC110 (the server's view)
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", gone_pid
            ):
                await asyncio.sleep(0.01)
        async with PostgresStore(pg_url) as store:
            assert await _listed(admin) == {
                "alive": admin.get_server_pid(),
                "earlier": None,
                store.origin: store.listener.server_pid,
            }
    finally:
        await admin.close()


async def test_the_password_in_the_url_never_reaches_an_error_or_a_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    host = SERVER.removeprefix("postgresql://").split("@")[-1].split(":")[0]
    store = PostgresStore(f"postgresql://nobody:s3cret-pw@{host}:1/none")
    with pytest.raises(StorageBrokenError) as raised:
        await store.open()
    assert "s3cret" not in str(raised.value)
    assert "s3cret" not in repr(store)
    assert "***" in store.where
    assert "s3cret" not in caplog.text


async def test_check_writable_asks_the_server(pg_url: str) -> None:
    async def no_threads(*_: Any) -> None:
        raise AssertionError("a server check needs no blocking helper")

    async with PostgresStore(pg_url) as writer:
        await writer.check_writable(2.0, no_threads)
    async with PostgresStore(pg_url, read_only=True) as reader:
        with pytest.raises(StorageBrokenError, match="does not take writes"):
            await reader.check_writable(2.0, no_threads)


async def test_a_read_is_one_round_trip_and_its_connection_comes_back_clean(pg_url: str) -> None:
    async with PostgresStore(pg_url, readers=1) as store:
        [[pid]] = await store.fetch("SELECT pg_backend_pid()")
        probe = await asyncpg.connect(pg_url)
        try:
            # An idle backend shows the last statement it ran: the read's own,
            # not a reset sent after it on release.
            last = await probe.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        finally:
            await probe.close()
        assert last == "SELECT pg_backend_pid()"
        # A reader that failed inside its snapshot leaves no transaction behind.
        with pytest.raises(asyncpg.DivisionByZeroError):
            async with store.reader() as conn:
                await conn.execute("SELECT 1 / 0")
        # (the one connection again, not stuck in the aborted transaction)
        assert await store.fetch("SELECT pg_backend_pid()") == [(pid,)]
    async with PostgresStore(pg_url, readers=1, read_only=True) as reader:
        await reader.fetch("SELECT 1")
        assert await reader.fetch("SHOW default_transaction_read_only") == [("on",)]


def test_a_store_skips_its_own_origin_by_prefix_only() -> None:
    from storage.postgres.listen import notices
    from storage.postgres.notify import own_prefix

    heard: list[Any] = []
    on_payload = notices("abc", heard.append)
    for payload in payloads("abc", [_record(1)]):
        on_payload(payload)
    assert heard == []  # its own commit, already published locally
    for payload in payloads("abcd", [_record(2)]):  # an origin "abc" is a prefix of
        on_payload(payload)
    assert [n.origin for n in heard] == ["abcd"]
    assert own_prefix("abc") == "v1 abc "


def test_a_notice_names_each_session_at_its_batch_s_last_seq() -> None:
    records = [_record(3), _record(4), attrs.evolve(_record(5), aggregate_id="ses_b", seq=1)]
    (payload,) = payloads("abc", records)
    notice = parse(payload)
    assert notice is not None
    assert (notice.first, notice.last) == (3, 5)
    assert notice.heads == (("ses_a", 4), ("ses_b", 1))


async def test_cancelled_appenders_keep_their_commands_and_their_failures_stay_quiet(
    pg_url: str, loop_hygiene: None
) -> None:
    """An append awaits its own future (no shield): cancelling the caller cancels
    that future only. The command still commits with its batch, and a command
    that fails with nobody left to hear it reaches no exception handler."""
    async with PostgresStore(pg_url) as store:
        good = asyncio.ensure_future(store.append(Command.of(created("ses_c"))))
        bad = asyncio.ensure_future(store.append(Command.of(renamed("ses_nobody", "x"))))
        await asyncio.sleep(0)  # both queued
        good.cancel()
        bad.cancel()
        for task in (good, bad):
            with pytest.raises(asyncio.CancelledError):
                await task
        await store.append(Command.of(renamed("ses_c", "after")))  # same session: behind it
        assert await store.last_seq("ses_c") == 2
        assert await store.last_seq("ses_nobody") == 0


async def test_a_closing_store_hears_another_hosts_commit_without_a_warning(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that is closing (its last writes still committing) gets a notice
    from another host: nothing is handed out any more, and nothing is logged."""
    from protocol.lifecycle import LifecycleState

    caplog.set_level(logging.WARNING)
    async with PostgresStore(pg_url) as a:
        b = PostgresStore(pg_url)
        async with b:
            # As close() sets it while it waits for the writes.
            b._lifecycle.state = LifecycleState.CLOSING
            await a.append(Command.of(created("ses_c")))
            async with asyncio.timeout(5):
                await b._deliver_task
            b._lifecycle.state = LifecycleState.OPEN  # let close() run as it would have
    assert "cannot read announced commits" not in caplog.text


@pytest.fixture
async def inspected(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to ``pg_url``'s database with pageinspect (to count index entries)."""
    conn = await asyncpg.connect(pg_url)
    try:
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        except asyncpg.PostgresError as exc:
            pytest.skip(f"pageinspect is not available on this server: {exc}")
        yield conn
    finally:
        await conn.close()


def at(event: ev.Event, created: int) -> Command:
    """``event`` as a command, created at ``created`` (ms): its session's time_updated."""
    return Command(events=(NewEvent(event=event, created=created),))


async def leaf_entries(conn: asyncpg.Connection, index: str) -> int:
    """Entries in ``index``, small enough to be one leaf (block 1; block 0 is its metapage)."""
    return int(await conn.fetchval(f"SELECT count(*) FROM bt_page_items('{index}', 1)"))


async def test_a_root_sessions_edits_add_nothing_to_the_parent_index(
    pg_url: str, inspected: asyncpg.Connection
) -> None:
    # An edit a second after the session's last moves time_bucket, which the
    # list's index holds, so it is no HOT update: it inserts into each index
    # whose predicate the new row meets. The parent index holds children only
    # (v13), so roots, most sessions, pay nothing there.
    roots = ("ses_r1", "ses_r2", "ses_r3")
    async with connect(pg_url) as store:
        for root in roots:
            await store.append(at(created(root), 50_000))
        for child in ("ses_c1", "ses_c2"):
            child_of = ev.SessionCreated(
                session_id=child, parent_id="ses_r1", title="t", location=Location(directory="/")
            )
            await store.append(Command.of(child_of))
        for n in range(1, 11):
            for root in roots:
                await store.append(at(renamed(root, f"title {n}"), 50_000 + 1000 * n))
        assert sorted(await store.queries.children("ses_r1")) == ["ses_c1", "ses_c2"]
    assert await leaf_entries(inspected, "session_updated") > len(roots) * 10
    assert await leaf_entries(inspected, "session_parent") == 2
    async with inspected.transaction():
        await inspected.execute("SET LOCAL enable_seqscan = off")
        plan = await inspected.fetchval(
            "EXPLAIN (FORMAT TEXT) SELECT id FROM session WHERE parent_id = 'ses_r1'"
        )
    assert "session_parent" in plan


async def test_edits_within_a_second_are_hot_updates_and_the_list_walks_its_index(
    pg_url: str, inspected: asyncpg.Connection
) -> None:
    # The list's index holds time_bucket (whole seconds of time_updated) alone
    # (v14): an edit in the same second as the last changes no indexed column,
    # so it adds no index entry; one in a later second does.
    roots = ("ses_r1", "ses_r2", "ses_r3")
    async with connect(pg_url) as store:
        for root in roots:
            await store.append(at(created(root), 50_000))
        for n in range(10):
            for root in roots:
                await store.append(at(renamed(root, f"title {n}"), 50_001 + n))
        assert await leaf_entries(inspected, "session_updated") == 3
        assert await leaf_entries(inspected, "session_pkey") == 3
        await store.append(at(renamed("ses_r1", "a second later"), 51_000))
        assert await leaf_entries(inspected, "session_updated") == 4
    rows = await inspected.fetch("SELECT id, time_bucket FROM session ORDER BY id")
    assert [tuple(r) for r in rows] == [("ses_r1", 51), ("ses_r2", 50), ("ses_r3", 50)]
    async with inspected.transaction():
        await inspected.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await inspected.fetch(
                "EXPLAIN SELECT id FROM session WHERE time_bucket <= 60"
                " AND (time_updated, id) < (60000, 'ses_x')"
                " ORDER BY time_bucket DESC, time_updated DESC, id DESC LIMIT 3"
            )
        )
    assert "session_updated" in plan
    assert "Incremental Sort" in plan


async def test_a_notice_heard_while_a_new_listen_connection_is_listed_comes_after_the_catch_up(
    pg_url: str,
) -> None:
    """A store lists a new listen connection (several statements) before it is
    told to catch up. A notice heard meanwhile was handed over first, so the
    store read that batch alone and moved its cursor past everything missed
    while nobody listened (they never reached a subscriber). Now such a
    payload waits for the owner to be told: "reconnected" comes first."""
    from storage.postgres.listen import Listener

    order: list[str] = []
    listing, sent, both = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def note(what: str) -> None:
        order.append(what)
        if len(order) == 2:
            both.set()

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(pg_url)

    async def on_listening(conn: asyncpg.Connection) -> None:
        if listener.connects == 0:
            return
        listing.set()
        await sent.wait()
        # The notice was committed before this round trip: it has been heard.
        await conn.fetchval("SELECT 1")

    listener = Listener(
        connect,
        "c",
        on_payload=note,
        on_reconnect=lambda: note("reconnected"),
        on_listening=on_listening,
    )
    await listener.start()
    notifier = await asyncpg.connect(pg_url)
    try:
        listener.kill_connection()
        async with asyncio.timeout(10):  # guards, not the synchronisation
            await listing.wait()
            await notifier.execute("SELECT pg_notify('c', 'a batch past the gap')")
            sent.set()
            await both.wait()
        assert order == ["reconnected", "a batch past the gap"]
    finally:
        await notifier.close()
        await listener.stop()
