"""The PostgreSQL writer's one-round-trip path gives what the savepoint path gives.

Each test feeds the same commands (same ids, same timestamps) to a store on
the fast path and to one with ``fast_path = False``, each on its own
database, and compares outcomes, the event rows and every projection table;
``batch_paths`` says which path each batch took, so a test that means to
exercise the fast path or its fallback checks that it did.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pgdb import database
from strategies import values_of

from protocol import REGISTRY, Location, encode_data, stored_type
from protocol import events as ev
from protocol.shapes import ModelRef
from storage import (
    Command,
    DivergedError,
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
from storage.postgres import PostgresStore
from storage.postgres._fast import (
    Fallback,
    Heads,
    Plans,
    _joined,
    _packed,
    ints_from,
    texts_from,
)
from storage.postgres.rebuild import dump_projections
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
    "",
)


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


def renamed(session_id: str, title: str) -> ev.SessionRenamed:
    return ev.SessionRenamed(session_id=session_id, title=title)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """(fast path, savepoint path only), each on a database of its own.

    One writer lane each: these tests submit their commands as one batch and
    count the batches (lanes would split a batch of 16 and more in two).
    """
    async with database() as url_fast, database() as url_slow:
        fast, slow = PostgresStore(url_fast, writers=1), PostgresStore(url_slow, writers=1)
        fast.fast_path = True
        slow.fast_path = False
        async with fast, slow:
            yield fast, slow


async def _outcomes(store: PostgresStore, commands: Sequence[Command]) -> list[Any]:
    """Submit ``commands`` as one batch; each one's records, or its error's type."""
    futures = [store.submit(c) for c in commands]
    done = await asyncio.gather(*futures, return_exceptions=True)
    return [type(d) if isinstance(d, BaseException) else _comparable(d) for d in done]


def _comparable(records: list[RecordedEvent]) -> list[tuple[Any, ...]]:
    # Positions differ between databases (a rolled-back attempt skips some).
    return [(r.id, r.aggregate_id, r.seq, r.type, r.created, r.data) for r in records]


async def _state(store: PostgresStore) -> tuple[Any, ...]:
    conn = await asyncpg.connect(store._url)
    try:
        events = await conn.fetch(
            "SELECT id, aggregate_id, seq, type, created, data FROM event ORDER BY position"
        )
        return [tuple(r) for r in events], await dump_projections(conn)
    finally:
        await conn.close()


async def _both(
    pair: tuple[PostgresStore, PostgresStore], commands: Sequence[Command]
) -> list[Any]:
    fast, slow = pair
    got, want = await _outcomes(fast, commands), await _outcomes(slow, commands)
    assert got == want
    return got


async def test_a_batch_that_commits_whole_takes_one_path_and_matches(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, slow = pair
    setup = [Command.of(created(f"ses_{i}")) for i in range(5)]
    await _both(pair, setup)
    commands = [
        Command.of(
            renamed(f"ses_{i % 5}", f"title {i}"),
            ev.AgentSelected(session_id=f"ses_{i % 5}", agent="build"),
        )
        for i in range(40)
    ]
    outcomes = await _both(pair, commands)
    assert [records[0][2] for records in outcomes[:5]] == [2, 2, 2, 2, 2]
    assert fast.batch_paths == {"fast": 2, "savepoints": 0, "plain": 0, "isolated": 0}
    assert slow.batch_paths == {"fast": 0, "savepoints": 0, "plain": 2, "isolated": 0}
    assert await _state(fast) == await _state(slow)


async def test_one_conflicting_command_falls_back_and_the_good_ones_commit(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, _ = pair
    await _both(pair, [Command.of(created("ses_a")), Command.of(created("ses_b"))])
    commands = [
        Command.of(renamed("ses_a", "one")),
        Command.of(renamed("ses_missing", "nobody")),  # projection: session.missing
        Command.of(renamed("ses_b", "two")),
        Command.of(created("ses_a")),  # projection: session.exists
        Command.of(renamed("ses_a", "three")),
        Command.of(renamed("ses_b", "late"), expected={"ses_b": 7}),  # behind
    ]
    outcomes = await _both(pair, commands)
    assert outcomes[1] is ProjectionConflict
    assert outcomes[3] is ProjectionConflict
    assert outcomes[5] is SeqConflictError
    assert [o[0][2] for o in (outcomes[0], outcomes[2], outcomes[4])] == [2, 2, 3]
    assert fast.batch_paths["savepoints"] == 1
    assert await _state(fast) == await _state(pair[1])
    # The next batch is back on the fast path, with the heads the fallback left.
    after = await _both(pair, [Command.of(renamed("ses_a", "four"))])
    assert after[0][0][2] == 4
    assert fast.batch_paths == {"fast": 2, "savepoints": 1, "plain": 0, "isolated": 0}


async def test_runs_of_a_keyed_update_check_each_ops_expectation_on_either_form(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """A run of one keyed UPDATE over distinct rows is one statement: its bare
    form when every op expects its row (the row count is the check), else
    the form that counts each op's rows. Both must answer as op by op."""
    fast, slow = pair
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
    # Every op expects its row: the bare form. Then checks with other
    # expectations leading the same run: the counting form.
    for command in (
        Command.of(*renames),
        Command.of(*renames, checks=(check("ses_3", None), check("ses_gone", 0))),
    ):
        before = dict(fast.batch_paths)
        await _both(pair, [command])
        assert fast.batch_paths == {**before, "fast": before["fast"] + 1}
    # A run whose expectation fails, in either form, fails its command alone.
    for refused in (
        Command.of(*renames[:2], renamed("ses_gone", "x")),
        Command.of(*renames, checks=(check("ses_3", 0),)),
    ):
        before = dict(fast.batch_paths)
        outcomes = await _both(pair, [refused, Command.of(renamed("ses_3", "fine"))])
        assert outcomes[0] is ProjectionConflict
        assert isinstance(outcomes[1], list)
        assert fast.batch_paths == {**before, "savepoints": before["savepoints"] + 1}
    assert await _state(fast) == await _state(slow)


async def test_hostile_strings_round_trip_byte_for_byte_on_the_fast_path(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, slow = pair
    await _both(pair, [Command.of(created("ses_h"))])
    for text in HOSTILE:
        commands = [
            Command.of(renamed("ses_h", text)),
            Command.of(ev.MetadataUpdated(session_id="ses_h", metadata={text: text})),
        ]
        await _both(pair, commands)
        for store in (fast, slow):
            [[title, metadata]] = await store.fetch(
                "SELECT title, metadata FROM session WHERE id = ?", ("ses_h",)
            )
            assert title == text
            assert metadata == json_text({text: text})
    assert fast.batch_paths == {
        "fast": 1 + len(HOSTILE),
        "savepoints": 0,
        "plain": 0,
        "isolated": 0,
    }
    assert await _state(fast) == await _state(slow)
    [[tables]] = await fast.fetch("SELECT count(*) FROM pg_tables WHERE tablename = 'event'")
    assert tables == 1


async def test_a_nul_is_refused_for_its_command_alone_as_on_the_savepoint_path(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, _ = pair
    await _both(pair, [Command.of(created("ses_n"))])
    outcomes = await _both(
        pair,
        [
            Command.of(renamed("ses_n", "before")),
            Command.of(renamed("ses_n", "a\x00b")),
            Command.of(renamed("ses_n", "after")),
        ],
    )
    assert outcomes[1] is StorageBrokenError
    assert [outcomes[0][0][2], outcomes[2][0][2]] == [2, 3]
    assert fast.batch_paths["savepoints"] == 1
    assert await _state(fast) == await _state(pair[1])


@pytest.mark.parametrize("text", ["a\x1fb", "\x1e", "\x1e\x1f", "end\x1f"])
async def test_a_text_holding_a_packing_mark_commits_whole_on_the_savepoint_path(
    pair: tuple[PostgresStore, PostgresStore], text: str
) -> None:
    """U+001E and U+001F split the fast path's packed text arrays, so a batch
    holding one steps aside before it writes, and the savepoint path commits
    it byte for byte."""
    fast, slow = pair
    await _both(pair, [Command.of(created("ses_m"))])
    outcomes = await _both(
        pair, [Command.of(renamed("ses_m", "before")), Command.of(renamed("ses_m", text))]
    )
    assert [o[0][2] for o in outcomes] == [2, 3]
    assert fast.batch_paths == {"fast": 1, "savepoints": 1, "plain": 0, "isolated": 0}
    for store in (fast, slow):
        [[title]] = await store.fetch("SELECT title FROM session WHERE id = ?", ("ses_m",))
        assert title == text
    assert await _state(fast) == await _state(slow)
    # The next batch, free of marks, is back on the fast path.
    await _both(pair, [Command.of(renamed("ses_m", "after"))])
    assert fast.batch_paths == {"fast": 2, "savepoints": 1, "plain": 0, "isolated": 0}


@given(st.lists(st.one_of(st.none(), st.text(st.characters(blacklist_characters="\x00")))))
def test_packed_text_arrays_split_back_exactly_or_step_aside(values: list[str | None]) -> None:
    """What the function's split gives back (emulated: ``string_to_array`` on the
    separator with the NULL mark, an empty text giving no element)."""
    try:
        packed = _packed(values)
    except Fallback:
        assert values == [""] or any(v is not None and ("\x1e" in v or "\x1f" in v) for v in values)
        return
    split = [None if p == "\x1e" else p for p in packed.split("\x1f")] if packed else []
    assert split == values


async def test_packed_arrays_reach_the_server_as_the_arrays_they_were() -> None:
    """The real split, on the server, for the shapes the function receives."""
    cases: list[list[str | None]] = [[], ["", ""], [None], ["a", None, ""], ["", "b"], ["x y", "é"]]
    async with database() as url:
        conn = await asyncpg.connect(url)
        try:
            for values in cases:
                got = await conn.fetchval(f"SELECT {texts_from('$1')}", _packed(values))
                assert got == values
            for ints in ([], [7], [1, None, -3]):
                got = await conn.fetchval(f"SELECT {ints_from('$1', 'bigint')}", _joined(ints))
                assert got == ints
        finally:
            await conn.close()


async def _commit_unheard(url: str, event: ev.SessionRenamed, *, seq: int) -> None:
    """Commit ``event`` at ``seq`` of its session straight to the table: a commit
    no store hears of (it sends no notice)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO event (id, aggregate_id, seq, type, created, data)"
            " VALUES ('evt_unheard', $1, $2, $3, 0, $4)",
            event.session_id,
            seq,
            stored_type(event),
            encode_data(event).decode(),
        )
    finally:
        await conn.close()


async def test_a_head_moved_unheard_sends_the_batch_to_the_savepoint_path() -> None:
    """A commit whose notice has not reached this store yet (here: one that
    sends none, written straight to the table) leaves its head stale."""
    async with database() as url:
        a = PostgresStore(url, writers=1)
        a.fast_path = True
        async with a:
            await a.append(Command.of(created("ses_x")))
            await a.append(Command.of(renamed("ses_x", "a1")))  # a remembers head 2
            await _commit_unheard(url, renamed("ses_x", "b1"), seq=3)
            [record] = await a.append(Command.of(renamed("ses_x", "a2")))
            assert record.seq == 4
            assert a.batch_paths["savepoints"] == 1
            [record] = await a.append(Command.of(renamed("ses_x", "a3")))
            assert record.seq == 5
            assert [r.seq for r in await a.read("ses_x")] == [1, 2, 3, 4, 5]


async def test_an_expected_head_moved_unheard_refuses_the_command_it_does_not_append_to() -> None:
    """A command may expect an aggregate it appends nothing to: the function
    checks that head itself (no insert would find it moved)."""
    async with database() as url:
        a = PostgresStore(url, writers=1)
        a.fast_path = True
        async with a:
            for command in (created("ses_a"), created("ses_b"), renamed("ses_b", "b1")):
                await a.append(Command.of(command))  # a remembers ses_b at 2
            await _commit_unheard(url, renamed("ses_b", "elsewhere"), seq=3)
            # The savepoint path's answer: ses_b's seq 3 is not what this command saw.
            with pytest.raises(DivergedError):
                await a.append(Command.of(renamed("ses_a", "a1"), expected={"ses_b": 2}))
            assert a.batch_paths["savepoints"] == 1
            assert [r.seq for r in await a.read("ses_a")] == [1]


async def test_a_head_moved_by_another_host_and_heard_keeps_the_fast_path() -> None:
    async with database() as url:
        a, b = PostgresStore(url, writers=1), PostgresStore(url, writers=1)
        a.fast_path = b.fast_path = True
        async with a, b:
            heard = asyncio.Event()
            a.subscribe(lambda records: any(r.seq == 3 for r in records) and heard.set())
            await a.append(Command.of(created("ses_x")))
            await a.append(Command.of(renamed("ses_x", "a1")))  # a remembers head 2
            await b.append(Command.of(renamed("ses_x", "b1")))  # head 3, announced
            async with asyncio.timeout(10):  # a guard, not the synchronisation
                await heard.wait()
            before = dict(a.batch_paths)
            [record] = await a.append(Command.of(renamed("ses_x", "a2")))
            assert record.seq == 4
            assert a.batch_paths == {
                "fast": before["fast"] + 1,
                "savepoints": 0,
                "plain": 0,
                "isolated": 0,
            }
            assert [r.seq for r in await a.read("ses_x")] == [1, 2, 3, 4]


@pytest.mark.parametrize("stored", sorted(REGISTRY))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_projectors_pass_the_position_through_untouched(stored: str, data: st.DataObject) -> None:
    """The fast path projects before positions exist (they are allocated under the lock).

    A projector may bind the position as a parameter (the function fills it
    in), but never compute with it or fold it into another value: the ops for
    one position are the ops for another with that parameter swapped.
    """
    event = data.draw(values_of(REGISTRY[stored]))
    record = RecordedEvent(
        position=1,
        id="evt_1",
        aggregate_id=str(getattr(event, "session_id", "ses_1")),
        seq=3,
        type=stored_type(event),
        created=1000,
        data=encode_data(event).decode(),
        event=event,
    )
    record = attrs.evolve(record, position=-(1 << 61) - 17)
    try:
        ops = project(record)
    except Exception:
        return  # an event a projector refuses is refused whatever its position
    moved = project(attrs.evolve(record, position=987_654_321))

    def swapped(params: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(987_654_321 if type(v) is int and v == record.position else v for v in params)

    assert [(op.sql, op.params, op.expect) for op in moved] == [
        (op.sql, swapped(op.params), op.expect) for op in ops
    ]


async def test_held_leases_commit_on_the_fast_path_and_a_stale_one_is_fenced_alone(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, slow = pair
    await _both(pair, [Command.of(created("ses_l")), Command.of(created("ses_m"))])
    take = Command.of(
        ev.ExecutionStarted(session_id="ses_l"), lease=LeaseUse.take("ses_l", "host-a", 60_000)
    )
    [[started]] = await _both(pair, [take])
    fence = Fence("ses_l", "host-a", 1)
    stale = Fence("ses_l", "host-a", 7)
    commands = [
        Command.of(renamed("ses_l", "held"), renamed("ses_m", "other"), lease=fence.hold()),
        Command.of(renamed("ses_l", "stale"), lease=stale.hold()),
        Command.of(renamed("ses_l", "held again"), lease=fence.hold()),
    ]
    outcomes = await _both(pair, commands)
    assert outcomes[1] is FencedError
    assert fast.batch_paths == {
        "fast": 2,
        "savepoints": 1,
        "plain": 0,
        "isolated": 0,
    }  # the fallback only
    held = [Command.of(renamed("ses_l", f"fast {i}"), lease=fence.hold()) for i in range(3)]
    futures = [fast.submit(c) for c in held]
    records = [r for f in futures for r in await f]
    assert [(r.seq, r.epoch) for r in records] == [(5, 1), (6, 1), (7, 1)]
    assert fast.batch_paths["fast"] >= 2
    for c in held:
        await slow.append(c)
    assert await _state(fast) == await _state(slow)
    for store in (fast, slow):
        fences = await store.fetch(
            "SELECT e.seq, f.host_id, f.epoch FROM event_fence f"
            " JOIN event e ON e.position = f.position ORDER BY e.seq"
        )
        assert fences == [(s, "host-a", 1) for s in (2, 3, 4, 5, 6, 7)], store
    assert started[2] == 2


async def _epochs(store: PostgresStore, commands: Sequence[Command]) -> list[Any]:
    """Like :func:`_outcomes`, each record as (aggregate, seq, epoch)."""
    done = await asyncio.gather(*(store.submit(c) for c in commands), return_exceptions=True)
    return [
        type(d) if isinstance(d, BaseException) else [(r.aggregate_id, r.seq, r.epoch) for r in d]
        for d in done
    ]


async def _leases(store: PostgresStore) -> tuple[Any, ...]:
    """The lease rows (their expiry as: gone, under 30 s away, further) and who
    wrote each fenced event."""
    conn = await asyncpg.connect(store._url)
    try:
        leases = await conn.fetch(
            "SELECT session_id, host_id, epoch,"
            " width_bucket(expires - (extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
            " ARRAY[0, 30000]::bigint[])"
            " FROM session_lease ORDER BY session_id"
        )
        fences = await conn.fetch(
            "SELECT e.aggregate_id, e.seq, f.host_id, f.epoch FROM event_fence f"
            " JOIN event e ON e.position = f.position ORDER BY e.aggregate_id, e.seq"
        )
        return [tuple(r) for r in leases], [tuple(r) for r in fences]
    finally:
        await conn.close()


async def _both_leased(
    pair: tuple[PostgresStore, PostgresStore], commands: Sequence[Command]
) -> list[Any]:
    fast, slow = pair
    got, want = await _epochs(fast, commands), await _epochs(slow, commands)
    assert got == want
    assert await _leases(fast) == await _leases(slow)
    assert await _state(fast) == await _state(slow)
    return got


def _started(session_id: str, lease: LeaseUse) -> Command:
    return Command.of(ev.ExecutionStarted(session_id=session_id), lease=lease)


async def test_takes_renewals_and_releases_commit_on_the_fast_path_as_on_the_savepoint_path(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, _ = pair
    sessions = [f"ses_t{i}" for i in range(4)]
    await _both_leased(pair, [Command.of(created(s)) for s in sessions])
    takes = [_started(s, LeaseUse.take(s, "host-a", 60_000)) for s in sessions]
    taken = await _both_leased(pair, takes)
    assert [records[0][2] for records in taken] == [1, 1, 1, 1]  # the server's epoch
    assert fast.batch_paths == {"fast": 2, "savepoints": 0, "plain": 0, "isolated": 0}
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
        Command.of(renamed("ses_t3", "t3")),
    ]
    outcomes = await _both_leased(pair, uses)
    assert outcomes[2] == [("ses_t2", 3, 2)]
    assert outcomes[3] == [("ses_t2", 4, 2), ("ses_t3", 3, None)]
    assert fast.batch_paths == {"fast": 3, "savepoints": 0, "plain": 0, "isolated": 0}


async def test_renewals_without_events_commit_on_the_fast_path_and_a_lost_one_is_fenced(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """What the lease keeper sends every ttl / 4: one event-less command per lease."""
    fast, _ = pair
    sessions = ["ses_r0", "ses_r1"]
    await _both_leased(pair, [Command.of(created(s)) for s in sessions])
    await _both_leased(pair, [_started(s, LeaseUse.take(s, "host-a", 60_000)) for s in sessions])
    renewals = [
        Command(events=(), lease=Fence("ses_r0", "host-a", 1).renew(5_000)),
        Command(events=(), lease=Fence("ses_r1", "host-a", 1).renew(5_000)),
    ]
    assert await _both_leased(pair, renewals) == [[], []]
    assert fast.batch_paths == {"fast": 3, "savepoints": 0, "plain": 0, "isolated": 0}
    lost = [Command(events=(), lease=Fence("ses_r1", "host-a", 9).renew(5_000))]
    assert await _both_leased(pair, lost) == [FencedError]


async def test_lease_uses_refused_in_a_batch_fall_back_and_fail_their_own_commands(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    fast, _ = pair
    await _both_leased(pair, [Command.of(created("ses_x")), Command.of(created("ses_y"))])
    await _both_leased(pair, [_started("ses_x", LeaseUse.take("ses_x", "host-a", 60_000))])
    commands = [
        Command.of(renamed("ses_y", "fine")),
        # Host B cannot take what A holds, live.
        _started("ses_x", LeaseUse.take("ses_x", "host-b", 60_000)),
        # A releases, then writes under the epoch it just gave up: in command order.
        Command.of(
            ev.ExecutionSucceeded(session_id="ses_x"), lease=Fence("ses_x", "host-a", 1).release()
        ),
        Command.of(renamed("ses_x", "late"), lease=Fence("ses_x", "host-a", 1).hold()),
        # Then B can take it: epoch 2.
        _started("ses_x", LeaseUse.take("ses_x", "host-b", 60_000)),
    ]
    outcomes = await _both_leased(pair, commands)
    assert outcomes[1] is LeaseHeldError
    assert outcomes[3] is FencedError
    assert outcomes[4] == [("ses_x", 4, 2)]
    assert fast.batch_paths["savepoints"] == 1


async def test_a_steps_json_path_updates_commit_on_the_fast_path_and_match(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """The projections of a step write through JSON paths (``'$.finish'``): a ``$``
    that cannot delimit a dollar quote, so the function holds those statements."""
    fast, _ = pair
    await _both(pair, [Command.of(created("ses_s"))])
    on = {"session_id": "ses_s", "assistant_message_id": "msg_s1"}
    model = ModelRef(id="scripted", provider_id="scripted")
    step = [
        Command.of(ev.StepStarted(**on, agent="build", model=model, started=1)),
        Command.of(ev.TextStarted(**on, ordinal=0)),
        Command.of(ev.TextEnded(**on, ordinal=0, text="$$ not a quote $1 $_srt_fn$")),
        Command.of(
            ev.StepEnded(**on, finish="stop", cost=0.5, tokens=ev.StepTokens(input=3, output=4))
        ),
    ]
    await _both(pair, step)
    assert fast.batch_paths == {"fast": 2, "savepoints": 0, "plain": 0, "isolated": 0}
    assert await _state(fast) == await _state(pair[1])


@pytest.mark.parametrize(
    ("sql", "held"),
    [
        ("UPDATE session SET title = json_extract(?, '$.a') WHERE id = ?", True),
        ("UPDATE session SET title = json_extract(?, '$[0]') WHERE id = ?", True),
        ("UPDATE session SET title = $$x$$ WHERE id = ?", False),
        ("UPDATE session SET title = $t$x$t$ WHERE id = ?", False),
        ("UPDATE session SET title = $1 WHERE id = ?", False),
        ("UPDATE session SET title = 'a$' WHERE id = ?", False),
    ],
)
async def test_the_function_holds_no_statement_whose_dollar_could_quote(
    pair: tuple[PostgresStore, PostgresStore], sql: str, held: bool
) -> None:
    fast, _ = pair
    conn = await asyncpg.connect(fast._url)
    try:
        assert (await Plans().plan(conn, sql) is not None) is held
    finally:
        await conn.close()


def test_a_notice_moves_a_remembered_head_forward_only() -> None:
    heads = Heads()
    heads.moved({"ses_a": 5, "ses_b": 2})
    heads.saw([("ses_a", 4), ("ses_b", 7), ("ses_new", 9)])  # late, ahead, unknown
    assert heads._seqs == {"ses_a": 5, "ses_b": 7}
