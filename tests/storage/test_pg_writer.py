"""The PostgreSQL writer: a batch in plain statements gives what a command at a time gives.

Most tests feed the same commands (same ids, same timestamps) to a store,
whose batches run plain, and to :func:`storage.postgres.writer.commit_batch`
with ``isolate=True`` (a SAVEPOINT per command, each command's statements
on its own) on a database of its own, and compare outcomes, the event rows,
every projection table, the lease rows and the fences; ``batch_paths`` says
whether the store's batch committed whole or was redone a command at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import attrs
import pytest
from pgdb import database

from protocol import Location, encode_data, stored_type
from protocol import events as ev
from protocol.shapes import ModelRef
from storage import (
    Command,
    Fence,
    FencedError,
    LeaseHeldError,
    LeaseUse,
    ProjectionConflict,
    RecordedEvent,
    SeqConflictError,
    StorageBrokenError,
)
from storage._ops import Op, json_text
from storage.batch import Outcome, prepare
from storage.postgres import LOG_LOCK, PostgresStore
from storage.postgres.rebuild import dump_projections, rebuild_projections
from storage.postgres.remote import RemoteCommits
from storage.postgres.runs import runs
from storage.postgres.store import CHAIN_MIN
from storage.postgres.writer import commit_batch
from storage.projectors import project

HOSTILE = (
    "it's",
    "''",
    "back\\slash \\' \\\\",
    "$$",
    "$_srt_fn$ END; $_srt_fn$",
    "'); DROP TABLE event; --",
    "/* unclosed",
    "? $1 $2::int8",
    "%L %s %I %%",
    "line\nbreak\r\ttab",
    "\u2028\u2029 é 漢字 🎉 \ufeff",
    "\\x00 (the text, not the byte)",
    "\x1e\x1f",
    "",
)


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


def renamed(session_id: str, title: str) -> ev.SessionRenamed:
    return ev.SessionRenamed(session_id=session_id, title=title)


class OneAtATime:
    """A database whose batches all run a command at a time (``isolate=True``)."""

    def __init__(self, url: str, conn: asyncpg.Connection) -> None:
        self.url = url
        self.conn = conn

    async def outcomes(self, commands: Sequence[Command]) -> list[Outcome]:
        prepared = [prepare(c) for c in commands]
        result = await commit_batch(
            self.conn, prepared, channel="c", origin="o", own=lambda a, b: None, isolate=True
        )
        return result.outcomes


@pytest.fixture
async def pair() -> AsyncIterator[tuple[PostgresStore, OneAtATime]]:
    async with database() as url_plain, database() as url_isolated:
        conn = await asyncpg.connect(url_isolated)
        try:
            async with PostgresStore(url_plain) as store:
                yield store, OneAtATime(url_isolated, conn)
        finally:
            await conn.close()


def _comparable(done: list[RecordedEvent] | BaseException) -> Any:
    """A command's records, or its error's type. Positions differ between the
    databases (a batch redone a command at a time skips some)."""
    if isinstance(done, BaseException):
        return type(done)
    return [(r.id, r.aggregate_id, r.seq, r.type, r.created, r.data, r.epoch) for r in done]


async def _state(url: str) -> tuple[Any, ...]:
    conn = await asyncpg.connect(url)
    try:
        events = await conn.fetch(
            "SELECT id, aggregate_id, seq, type, created, data FROM event ORDER BY position"
        )
        leases = await conn.fetch(
            "SELECT session_id, host_id, epoch, expires > 0 FROM session_lease ORDER BY 1"
        )
        fences = await conn.fetch(
            "SELECT e.id, f.session_id, f.host_id, f.epoch FROM event_fence f"
            " JOIN event e ON e.position = f.position ORDER BY e.id"
        )
        return (
            [tuple(r) for r in events],
            await dump_projections(conn),
            [tuple(r) for r in leases],
            [tuple(r) for r in fences],
        )
    finally:
        await conn.close()


async def _both(
    pair: tuple[PostgresStore, OneAtATime], commands: Sequence[Command], *, plain: bool = True
) -> list[Any]:
    """Each side's outcomes (they must agree) and states (likewise); ``plain``: the
    store's batch committed whole, else it was redone a command at a time."""
    store, other = pair
    before = dict(store.batch_paths)
    done = await asyncio.gather(*(store.submit(c) for c in commands), return_exceptions=True)
    got = [_comparable(d) for d in done]
    want = [
        _comparable(o.error if o.records is None else o.records)
        for o in await other.outcomes(commands)
    ]
    assert got == want
    path = "plain" if plain else "isolated"
    assert store.batch_paths == {**before, path: before[path] + 1}
    assert await _state(store._url) == await _state(other.url)
    return got


async def test_a_batch_of_many_sessions_commits_whole_and_matches_a_command_at_a_time(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    await _both(pair, [Command.of(created(f"ses_{i}")) for i in range(5)])
    commands = [
        Command.of(
            renamed(f"ses_{i % 5}", f"title {i}"),
            ev.AgentSelected(session_id=f"ses_{i % 5}", agent="build"),
        )
        for i in range(40)
    ]
    outcomes = await _both(pair, commands)
    assert [records[0][2] for records in outcomes[:5]] == [2, 2, 2, 2, 2]
    assert [records[1][2] for records in outcomes[35:]] == [17, 17, 17, 17, 17]


async def test_commands_only_the_server_refuses_fail_alone_when_the_batch_is_redone(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    await _both(pair, [Command.of(created("ses_a")), Command.of(created("ses_b"))])
    commands = [
        Command.of(renamed("ses_a", "one")),
        Command.of(renamed("ses_missing", "nobody")),  # projection: session.missing
        Command.of(renamed("ses_b", "two")),
        Command.of(created("ses_a")),  # projection: session.exists
        Command.of(renamed("ses_a", "three")),
        Command.of(renamed("ses_b", "late"), expected={"ses_b": 7}),  # behind
    ]
    outcomes = await _both(pair, commands, plain=False)
    assert outcomes[1] is ProjectionConflict
    assert outcomes[3] is ProjectionConflict
    assert outcomes[5] is SeqConflictError
    assert [o[0][2] for o in (outcomes[0], outcomes[2], outcomes[4])] == [2, 2, 3]
    # The next batch commits whole again.
    after = await _both(pair, [Command.of(renamed("ses_a", "four"))])
    assert after[0][0][2] == 4


async def test_every_op_of_a_run_is_held_to_its_own_row_count(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    """A run is one executemany; each op's rows come back counted apart, so an op
    expecting 0 beside ops expecting 1 or nothing is checked as if alone."""
    await _both(pair, [Command.of(created(f"ses_{i}")) for i in range(4)])
    event = renamed("ses_0", "x")
    [title] = project(
        RecordedEvent(
            position=1,
            id="evt_x",
            aggregate_id="ses_0",
            seq=2,
            type=stored_type(event),
            created=1,
            data=encode_data(event).decode(),
            event=event,
        )
    )

    def check(session_id: str, expect: int | None) -> Op:
        """The renames' own statement, as a check with another expectation."""
        return attrs.evolve(title, params=("checked", 1, session_id), expect=expect)

    renames = [renamed(f"ses_{i}", f"title {i}") for i in range(3)]
    await _both(pair, [Command.of(*renames, checks=(check("ses_3", None), check("ses_gone", 0)))])
    for refused in (
        Command.of(*renames[:2], renamed("ses_gone", "x")),
        Command.of(*renames, checks=(check("ses_3", 0),)),
        Command.of(*renames, checks=(check("ses_gone", 1),)),
    ):
        outcomes = await _both(pair, [refused, Command.of(renamed("ses_3", "fine"))], plain=False)
        assert outcomes[0] is ProjectionConflict
        assert isinstance(outcomes[1], list)


async def test_hostile_strings_round_trip_byte_for_byte(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    store, _ = pair
    await _both(pair, [Command.of(created("ses_h"))])
    for text in HOSTILE:
        commands = [
            Command.of(renamed("ses_h", text)),
            Command.of(ev.MetadataUpdated(session_id="ses_h", metadata={text: text})),
        ]
        await _both(pair, commands)
        [[title, metadata]] = await store.fetch(
            "SELECT title, metadata FROM session WHERE id = ?", ("ses_h",)
        )
        assert title == text
        assert metadata == json_text({text: text})
    [[tables]] = await store.fetch("SELECT count(*) FROM pg_tables WHERE tablename = 'event'")
    assert tables == 1


async def test_a_nul_is_refused_for_its_command_alone(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    await _both(pair, [Command.of(created("ses_n"))])
    commands = [
        Command.of(renamed("ses_n", "before")),
        Command.of(renamed("ses_n", "a\x00b")),
        Command.of(renamed("ses_n", "after")),
    ]
    outcomes = await _both(pair, commands, plain=False)
    assert outcomes[1] is StorageBrokenError
    assert [outcomes[0][0][2], outcomes[2][0][2]] == [2, 3]


async def test_a_step_of_several_sessions_interleaved_keeps_each_sessions_order(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    """Each session's step inserts its message, then its part, then updates both:
    later statements need the earlier ones' rows. Interleaved over three
    sessions in one batch, the statements group into runs across sessions and
    keep each session's order (the batch commits whole, projections equal)."""
    sessions = ["ses_s0", "ses_s1", "ses_s2"]
    await _both(pair, [Command.of(created(s)) for s in sessions])
    model = ModelRef(id="scripted", provider_id="scripted")

    def step(session_id: str) -> list[Command]:
        on = {"session_id": session_id, "assistant_message_id": f"msg_{session_id}"}
        return [
            Command.of(ev.StepStarted(**on, agent="build", model=model, started=1)),
            Command.of(ev.TextStarted(**on, ordinal=0)),
            Command.of(ev.TextEnded(**on, ordinal=0, text="$$ not a quote $1 '$.x'")),
            Command.of(ev.TextStarted(**on, ordinal=1)),
            Command.of(ev.TextEnded(**on, ordinal=1, text="more")),
            Command.of(
                ev.StepEnded(**on, finish="stop", cost=0.5, tokens=ev.StepTokens(input=3, output=4))
            ),
        ]

    steps = [step(s) for s in sessions]
    interleaved = [command for group in zip(*steps, strict=True) for command in group]
    await _both(pair, interleaved)


async def test_a_statement_one_session_runs_first_waits_for_anothers_earlier_ones(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    """Grouping by statement text alone would put ses_b's text fill (an upsert)
    in ses_a's fill run, ahead of ses_b's part insert: the fill would create the
    part at its own seq, the insert then do nothing, and the projection differ
    from the replay without any op failing. Runs wait for a session's earlier
    statements instead."""
    store, _ = pair
    model = ModelRef(id="scripted", provider_id="scripted")
    a = {"session_id": "ses_a", "assistant_message_id": "msg_a"}
    b = {"session_id": "ses_b", "assistant_message_id": "msg_b"}
    await _both(pair, [Command.of(created("ses_a")), Command.of(created("ses_b"))])
    await _both(
        pair,
        [
            Command.of(ev.StepStarted(**a, agent="build", model=model, started=1)),
            Command.of(ev.TextStarted(**a, ordinal=0)),
            Command.of(ev.StepStarted(**b, agent="build", model=model, started=1)),
        ],
    )
    await _both(
        pair,
        [
            Command.of(ev.TextEnded(**a, ordinal=0, text="a")),
            Command.of(ev.TextStarted(**b, ordinal=0)),
            Command.of(ev.TextEnded(**b, ordinal=0, text="b")),
        ],
    )
    stored, rebuilt = await rebuild_projections(store._url)
    assert stored == rebuilt
    [[position]] = await store.fetch(
        "SELECT p.position FROM session_part p WHERE p.message_id = 'msg_b'"
    )
    assert position == 3  # the seq of ses_b's TextStarted, not of its TextEnded


# -- runs ---------------------------------------------------------------------------------------


def _op(sql: str, name: str) -> tuple[frozenset[str], Op]:
    return frozenset({name.split(".")[0]}), Op(sql, (name,))


def test_runs_group_a_statement_across_sessions_and_keep_each_sessions_order() -> None:
    ops = [
        _op("A", "s1.a1"),
        _op("A", "s2.a1"),
        _op("B", "s1.b1"),
        _op("A", "s1.a2"),  # after s1's B: a run of its own, not the first A run
        _op("B", "s2.b1"),  # joins s1's B run
        _op("A", "s3.a1"),  # s3 has nothing earlier: the first A run
        _op("A", "s2.a2"),  # after s2's B: joins the second A run
    ]
    got = [(run[0].sql, [op.params[0] for op in run]) for run in runs(ops)]
    assert got == [
        ("A", ["s1.a1", "s2.a1", "s3.a1"]),
        ("B", ["s1.b1", "s2.b1"]),
        ("A", ["s1.a2", "s2.a2"]),
    ]


def test_an_op_of_several_sessions_waits_for_each_of_them() -> None:
    fork = (frozenset({"s1", "s2"}), Op("A", ("fork",)))
    ops = [_op("A", "s1.a"), _op("B", "s2.b"), fork, _op("A", "s3.a")]
    got = [[op.params[0] for op in run] for run in runs(ops)]
    assert got == [["s1.a", "s3.a"], ["s2.b"], ["fork"]]


# -- leases -------------------------------------------------------------------------------------


def _started(session_id: str, lease: LeaseUse) -> Command:
    return Command.of(ev.ExecutionStarted(session_id=session_id), lease=lease)


async def test_held_leases_commit_whole_and_a_stale_one_is_fenced_alone(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    await _both(pair, [Command.of(created("ses_l")), Command.of(created("ses_m"))])
    [started] = await _both(pair, [_started("ses_l", LeaseUse.take("ses_l", "host-a", 60_000))])
    assert [(r[1], r[2], r[6]) for r in started] == [("ses_l", 2, 1)]
    fence = Fence("ses_l", "host-a", 1)
    stale = Fence("ses_l", "host-a", 7)
    commands = [
        Command.of(renamed("ses_l", "held"), renamed("ses_m", "other"), lease=fence.hold()),
        Command.of(renamed("ses_l", "stale"), lease=stale.hold()),
        Command.of(renamed("ses_l", "held again"), lease=fence.hold()),
    ]
    # Decided in Python under the lock: the stale one is refused without a redo.
    outcomes = await _both(pair, commands)
    assert outcomes[1] is FencedError
    assert [(r[1], r[2], r[6]) for r in outcomes[0]] == [("ses_l", 3, 1), ("ses_m", 2, None)]
    assert [(r[1], r[2], r[6]) for r in outcomes[2]] == [("ses_l", 4, 1)]


async def test_takes_renewals_and_releases_in_one_batch_apply_in_command_order(
    pair: tuple[PostgresStore, OneAtATime],
) -> None:
    sessions = [f"ses_t{i}" for i in range(4)]
    await _both(pair, [Command.of(created(s)) for s in sessions])
    taken = await _both(pair, [_started(s, LeaseUse.take(s, "host-a", 60_000)) for s in sessions])
    assert [records[0][6] for records in taken] == [1, 1, 1, 1]
    uses = [
        Command.of(renamed("ses_t0", "renewed"), lease=Fence("ses_t0", "host-a", 1).renew(5_000)),
        Command.of(
            ev.ExecutionSucceeded(session_id="ses_t1"), lease=Fence("ses_t1", "host-a", 1).release()
        ),
        # Taken again by the same host in the same batch: epoch 2, then held.
        _started("ses_t2", LeaseUse.take("ses_t2", "host-a", 60_000)),
        Command.of(
            renamed("ses_t2", "held"),
            renamed("ses_t3", "unfenced"),
            lease=Fence("ses_t2", "host-a", 2).hold(),
        ),
        Command(events=(), lease=Fence("ses_t3", "host-a", 1).renew(5_000)),
        # Host B cannot take what A holds, live; A's release lets it.
        _started("ses_t0", LeaseUse.take("ses_t0", "host-b", 60_000)),
        _started("ses_t1", LeaseUse.take("ses_t1", "host-b", 60_000)),
        # A writes under the epoch it gave up: fenced.
        Command.of(renamed("ses_t1", "late"), lease=Fence("ses_t1", "host-a", 1).hold()),
    ]
    outcomes = await _both(pair, uses)
    assert [(r[1], r[2], r[6]) for r in outcomes[2]] == [("ses_t2", 3, 2)]
    assert [(r[1], r[2], r[6]) for r in outcomes[3]] == [("ses_t2", 4, 2), ("ses_t3", 3, None)]
    assert outcomes[4] == []
    assert outcomes[5] is LeaseHeldError
    assert [(r[1], r[2], r[6]) for r in outcomes[6]] == [("ses_t1", 4, 2)]
    assert outcomes[7] is FencedError


# -- the one writer -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def lock_held(url: str) -> AsyncIterator[asyncpg.Connection]:
    """The batch lock held (session-level) by a connection of the test's own."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", LOG_LOCK)
        try:
            yield conn
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", LOG_LOCK)
    finally:
        await conn.close()


async def test_commands_commit_in_submission_order_behind_the_batch_lock(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        await store.append(Command.of(created("ses_a")))
        async with lock_held(pg_url) as outsider:
            futures = [store.submit(Command.of(renamed("ses_a", str(i)))) for i in range(40)]
            async with asyncio.timeout(10):  # a guard, not the synchronisation
                while not await outsider.fetchval(  # noqa: ASYNC110 (the server's view)
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                ):
                    await asyncio.sleep(0.02)
            assert not any(f.done() for f in futures)
        results = await asyncio.gather(*futures)
    assert [r[0].seq for r in results] == list(range(2, 42))
    positions = [r[0].position for r in results]
    assert positions == sorted(positions)


async def test_appenders_appending_again_find_the_next_batch_begun_and_an_idle_store_frees_the_lock(
    pg_url: str,
) -> None:
    """A batch of :data:`CHAIN_MIN` commands or more ends with the next one's
    BEGIN and lock; its appenders, appending again at once, commit in it, and
    once they stop the store gives the lock back (another host gets it)."""
    sessions = [f"ses_chain{i}" for i in range(CHAIN_MIN * 2)]
    async with PostgresStore(pg_url) as store:
        await asyncio.gather(*(store.append(Command.of(created(s))) for s in sessions))

        async def appender(session_id: str) -> list[int]:
            seqs = []
            for i in range(5):
                if session_id == sessions[0] and i == 3:
                    # Only the server refuses it: its batch, begun by the one
                    # before, is redone a command at a time, and it fails alone.
                    with pytest.raises(StorageBrokenError):
                        await store.append(Command.of(renamed(session_id, "a\x00b")))
                seqs.append((await store.append(Command.of(renamed(session_id, str(i)))))[0].seq)
            return seqs

        seqs = await asyncio.gather(*(appender(s) for s in sessions))
        assert store.chains["taken"] >= 4
        assert store.batch_paths["isolated"] == 1
        conn = await asyncpg.connect(pg_url)
        try:
            async with asyncio.timeout(10), conn.transaction():  # a guard, not the synchronisation
                await conn.execute("SELECT pg_advisory_xact_lock($1)", LOG_LOCK)
        finally:
            await conn.close()
        assert store.chains["released"] >= 1
        # The store still writes after giving the lock back.
        [again] = await store.append(Command.of(renamed(sessions[0], "again")))
    assert seqs == [[2, 3, 4, 5, 6]] * len(sessions)
    assert again.seq == 7


async def test_a_single_appender_never_holds_the_lock_between_its_appends(pg_url: str) -> None:
    """Below :data:`CHAIN_MIN` commands a batch ends with a plain COMMIT: the
    lock is free whenever the writer is idle."""
    async with PostgresStore(pg_url) as store:
        await store.append(Command.of(created("ses_one")))
        for i in range(3):
            await store.append(Command.of(renamed("ses_one", str(i))))
            async with asyncio.timeout(10), lock_held(pg_url):  # waits if the store holds it
                pass
    assert store.chains == {"taken": 0, "released": 0}


async def test_a_catch_up_skips_the_stores_own_batches() -> None:
    data = encode_data(renamed("ses_a", "x")).decode()
    rows = [(p, f"evt_{p}", "ses_a", p, "session.renamed.1", 0, data) for p in range(1, 8)]
    handed: list[int] = []
    read = asyncio.Event()

    async def fetch(sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return [r for r in rows if r[0] > params[0]][: params[1]]

    def publish(records: Sequence[RecordedEvent]) -> None:
        handed.extend(r.position for r in records)
        read.set()

    remote = RemoteCommits(fetch, publish)
    remote.own(2, 3)
    remote.own(6, 6)
    remote.lost_notices()
    task = asyncio.create_task(remote.deliver())
    try:
        async with asyncio.timeout(5):  # a guard, not the synchronisation
            await read.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert handed == [1, 4, 5, 7]
