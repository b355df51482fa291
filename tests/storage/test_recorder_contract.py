"""The store contract: every backend must pass this module.

The log (append, read, subscribe …), the projection reads the runtime uses
(:class:`storage.SessionReads`), and "replaying the log rebuilds every
projection exactly" after a varied runtime workload.

To add a backend, add an entry to ``BACKENDS``: an async context manager
that sets a database up for one test and yields a :class:`StoreFactory` (what
``storage.connect`` opens, and how to rebuild that backend's projections);
nothing else here may depend on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import attrs
import pgdb
import pytest

from protocol import Location
from protocol import events as ev
from protocol.shapes import SessionRevert
from storage import (
    AppendConflictError,
    Command,
    DivergedError,
    NewEvent,
    ProjectionConflict,
    RecordedEvent,
    SeqConflictError,
    Store,
    Synchronous,
    connect,
    no_staged_revert,
    rebuild_projections,
)

Dump = dict[str, list[tuple[Any, ...]]]


@attrs.frozen(kw_only=True)
class StoreFactory:
    """One backend under test; calling it gives an unopened store (``async with``)."""

    #: What ``storage.connect`` (and ``RuntimeConfig.database``) opens.
    database: str
    #: (stored, rebuilt by replaying the log) projection dumps of ``database``.
    rebuild: Callable[[str], Awaitable[tuple[Dump, Dump]]]
    synchronous: Synchronous = "FULL"

    def __call__(self, **options: Any) -> Store:
        return connect(self.database, synchronous=self.synchronous, **options)


async def _sqlite_rebuild(database: str) -> tuple[Dump, Dump]:
    return await asyncio.to_thread(rebuild_projections, database)


@contextlib.asynccontextmanager
async def _sqlite(tmp: Path, synchronous: Synchronous) -> AsyncIterator[StoreFactory]:
    yield StoreFactory(
        database=str(tmp / f"{synchronous.lower()}.sqlite"),
        rebuild=_sqlite_rebuild,
        synchronous=synchronous,
    )


async def _postgres_rebuild(database: str) -> tuple[Dump, Dump]:
    from storage.postgres.rebuild import rebuild_projections as rebuild

    return await rebuild(database)


@contextlib.asynccontextmanager
async def _postgres(tmp: Path) -> AsyncIterator[StoreFactory]:
    # A database of this test's own on the real server (skips when there is none).
    async with pgdb.database() as url:
        yield StoreFactory(database=url, rebuild=_postgres_rebuild)


BACKENDS: dict[str, Callable[[Path], AbstractAsyncContextManager[StoreFactory]]] = {
    "sqlite": lambda tmp: _sqlite(tmp, "FULL"),
    "sqlite-normal": lambda tmp: _sqlite(tmp, "NORMAL"),
    "postgresql": _postgres,
}


@pytest.fixture(params=sorted(BACKENDS))
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    async with BACKENDS[request.param](tmp_path) as factory:
        yield factory


@pytest.fixture
async def recorder(store_factory: StoreFactory) -> AsyncIterator[Store]:
    async with store_factory() as store:
        yield store


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


def renamed(session_id: str, title: str) -> ev.SessionRenamed:
    return ev.SessionRenamed(session_id=session_id, title=title)


async def test_seq_counts_from_one_per_aggregate_and_position_is_global(recorder: Any) -> None:
    a = await recorder.append(Command.of(created("ses_a"), renamed("ses_a", "x")))
    b = await recorder.append(Command.of(created("ses_b")))
    c = await recorder.append(Command.of(renamed("ses_a", "y")))
    assert [r.seq for r in a] == [1, 2]
    assert [r.seq for r in b] == [1]
    assert [r.seq for r in c] == [3]
    positions = [r.position for r in a + b + c]
    assert positions == sorted(positions)
    assert len(set(positions)) == 4
    assert await recorder.last_seq("ses_a") == 3
    assert await recorder.last_seq("ses_unknown") == 0


async def test_read_is_exclusive_of_after_and_bounded(recorder: Any) -> None:
    await recorder.append(
        Command.of(created("ses_a"), *(renamed("ses_a", str(i)) for i in range(5)))
    )
    await recorder.append(Command.of(created("ses_b")))
    page = await recorder.read("ses_a", after=2, limit=2)
    assert [r.seq for r in page] == [3, 4]
    assert [r.event.title for r in page] == ["1", "2"]
    assert await recorder.read("ses_a", after=6) == []
    everything = await recorder.read_all(after=0)
    assert [r.position for r in everything] == sorted(r.position for r in everything)
    assert len(everything) == 7
    tail = await recorder.read_all(after=everything[4].position)
    assert tail == everything[5:]


async def test_read_returns_what_append_returned(recorder: Any) -> None:
    appended = await recorder.append(Command.of(created("ses_a"), renamed("ses_a", "x")))
    assert await recorder.read("ses_a") == appended
    assert appended[1].type == "session.renamed.1"
    assert appended[1].event == renamed("ses_a", "x")


async def test_expected_seq_guards_concurrent_writers(recorder: Any) -> None:
    await recorder.append(Command.of(created("ses_a"), expected={"ses_a": 0}))
    await recorder.append(Command.of(renamed("ses_a", "x"), expected={"ses_a": 1}))
    with pytest.raises(DivergedError):
        await recorder.append(Command.of(renamed("ses_a", "late"), expected={"ses_a": 1}))
    with pytest.raises(SeqConflictError):
        await recorder.append(Command.of(renamed("ses_a", "gap"), expected={"ses_a": 7}))
    assert await recorder.last_seq("ses_a") == 2


async def test_exact_replay_is_idempotent_and_not_republished(recorder: Any) -> None:
    seen: list[RecordedEvent] = []
    recorder.subscribe(seen.extend)
    command = Command.of(created("ses_a"), renamed("ses_a", "x"), expected={"ses_a": 0})
    first = await recorder.append(command)
    again = await recorder.append(command)
    assert again == first
    assert seen == first
    assert await recorder.last_seq("ses_a") == 2


async def test_replay_with_other_data_diverges(recorder: Any) -> None:
    original = NewEvent(event=created("ses_a"))
    await recorder.append(Command(events=(original,), expected={"ses_a": 0}))
    forged = NewEvent(
        event=ev.SessionCreated(
            session_id="ses_a", title="other", location=Location(directory="/")
        ),
        id=original.id,
        created=original.created,
    )
    with pytest.raises(DivergedError):
        await recorder.append(Command(events=(forged,), expected={"ses_a": 0}))


async def test_an_event_id_is_never_reused(recorder: Any) -> None:
    first = NewEvent(event=created("ses_a"))
    await recorder.append(Command(events=(first,)))
    reuse = NewEvent(event=created("ses_b"), id=first.id)
    with pytest.raises(AppendConflictError):
        await recorder.append(Command(events=(reuse,)))
    assert await recorder.last_seq("ses_b") == 0


async def test_a_failing_command_fails_alone_in_its_batch(recorder: Any) -> None:
    await recorder.append(Command.of(created("ses_a")))
    seen: list[RecordedEvent] = []
    recorder.subscribe(seen.extend)
    results = await asyncio.gather(
        recorder.append(Command.of(renamed("ses_a", "one"))),
        # Two events, the second refused by its projector: neither may be stored.
        recorder.append(
            Command.of(
                renamed("ses_a", "doomed"),
                ev.InboxCancelled(session_id="ses_a", inbox_id="msg_none"),
            )
        ),
        recorder.append(Command.of(renamed("ses_a", "two"))),
        return_exceptions=True,
    )
    assert isinstance(results[1], ProjectionConflict)
    stored = await recorder.read("ses_a")
    assert [r.event.title for r in stored[1:]] == ["one", "two"]
    assert [r.seq for r in stored] == [1, 2, 3]
    assert seen == stored[1:]


async def test_a_command_whose_check_fails_writes_nothing_and_fails_alone(
    recorder: Any,
) -> None:
    await recorder.append(Command.of(created("ses_a"), created("ses_b")))
    staged = ev.RevertStaged(session_id="ses_b", revert=SessionRevert(message_id="msg_x"))
    await recorder.append(Command.of(staged))

    def checked(title: str, session_id: str) -> Awaitable[list[RecordedEvent]]:
        command = Command.of(renamed(session_id, title), checks=(no_staged_revert(session_id),))
        return recorder.append(command)  # type: ignore[no-any-return]

    results = await asyncio.gather(
        checked("one", "ses_a"),
        checked("doomed", "ses_b"),
        recorder.append(Command.of(renamed("ses_a", "two"), checks=(no_staged_revert("ses_x"),))),
        recorder.append(Command.of(renamed("ses_a", "three"))),
        return_exceptions=True,
    )
    for refused in (results[1], results[2]):
        assert isinstance(refused, ProjectionConflict)
        assert refused.reason == "session.reverted"
    titles = [r.event.title for r in await recorder.read("ses_a") if r.seq > 1]
    assert titles == ["one", "three"]
    assert [r.type for r in await recorder.read("ses_b")] == [
        "session.created.1",
        "session.revert.staged.1",
    ]


async def test_many_concurrent_producers_never_gap_or_repeat(recorder: Any) -> None:
    await recorder.append(Command.of(created("ses_a"), created("ses_b")))
    await asyncio.gather(
        *(recorder.append(Command.of(renamed(f"ses_{'ab'[i % 2]}", str(i)))) for i in range(300))
    )
    for agg in ("ses_a", "ses_b"):
        seqs = [r.seq for r in await recorder.read(agg, limit=1000)]
        assert seqs == list(range(1, 152))


async def test_subscribers_see_batches_in_position_order_and_can_leave(recorder: Any) -> None:
    batches: list[list[int]] = []
    stop = recorder.subscribe(lambda recs: batches.append([r.position for r in recs]))
    await asyncio.gather(*(recorder.append(Command.of(created(f"ses_{i}"))) for i in range(20)))
    flat = [p for batch in batches for p in batch]
    assert flat == sorted(flat)
    assert len(flat) == 20
    stop()
    await recorder.append(Command.of(created("ses_after")))
    assert sum(len(b) for b in batches) == 20


async def test_a_broken_subscriber_does_not_starve_the_others(
    recorder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[RecordedEvent] = []

    def broken(_: Any) -> None:
        raise RuntimeError("subscriber bug")

    recorder.subscribe(broken)
    recorder.subscribe(seen.extend)
    await recorder.append(Command.of(created("ses_a")))
    assert len(seen) == 1
    assert "subscriber failed" in caplog.text


async def test_empty_command_stores_nothing(recorder: Any) -> None:
    assert await recorder.append(Command(events=())) == []
    assert await recorder.read_all() == []


async def test_the_session_list_pages_in_exact_update_order_across_seconds(
    recorder: Any,
) -> None:
    # The list walks a per-second bucket first (schema v14), then the exact
    # (time_updated, id): ties within a millisecond, within a second, and on
    # both sides of a second's edge must come out in one order both ways.
    from protocol.cursor import SessionCursor, SessionQuery, decode_cursor

    times = {
        "ses_a": 5_999,
        "ses_b": 6_000,
        "ses_c": 6_000,
        "ses_d": 6_500,
        "ses_e": 6_999,
        "ses_f": 7_000,
        "ses_g": 7_000,
        "ses_h": 8_001,
        "ses_i": 60_000,
    }
    for sid, created_at in times.items():
        await recorder.append(Command(events=(NewEvent(event=created(sid), created=created_at),)))
    # An edit moves a session to its new time, across a second's edge.
    await recorder.append(
        Command(events=(NewEvent(event=renamed("ses_a", "moved"), created=7_000),))
    )
    times["ses_a"] = 7_000
    for order in ("desc", "asc"):
        expected = sorted(times, key=lambda sid: (times[sid], sid), reverse=order == "desc")
        page = await recorder.queries.sessions(SessionQuery(order=order, limit=2), None)
        walked = [s.id for s in page.data]
        pages = [page]
        while page.cursor.next is not None:
            cursor = decode_cursor(SessionCursor, page.cursor.next)
            page = await recorder.queries.sessions(cursor.query, cursor.anchor)
            walked += [s.id for s in page.data]
            pages.append(page)
        assert walked == expected
        # And back from the last page, through every previous link.
        back: list[str] = []
        while page.cursor.previous is not None:
            cursor = decode_cursor(SessionCursor, page.cursor.previous)
            page = await recorder.queries.sessions(cursor.query, cursor.anchor)
            back = [s.id for s in page.data] + back
        assert back + [s.id for s in pages[-1].data] == expected


# -- the reads, and the rebuild, after a real runtime workload ----------------------------------


@contextlib.asynccontextmanager
async def runtime_on(factory: StoreFactory, tmp: Path) -> AsyncIterator[Any]:
    """A real runtime (scripted model, built-in tools) whose store is ``factory``'s database."""
    from actors.runtime import Runtime, RuntimeConfig

    workdir = tmp / "project"
    workdir.mkdir(exist_ok=True)
    (workdir / "README.md").write_text("hello from the workdir\n")
    config = RuntimeConfig(
        data_dir=tmp / "data",
        default_directory=str(workdir),
        database=factory.database,
        synchronous=factory.synchronous,
    )
    async with Runtime(config) as rt:
        yield rt


async def turn(rt: Any, session_id: str, text: str) -> None:
    from protocol.requests import PromptInput

    await rt.sessions.prompt(session_id, PromptInput(text=text))
    await rt.execution.wait_idle(session_id)


async def eventually(probe: Callable[[], Awaitable[Any]], within: float = 10) -> Any:
    """The first truthy result of ``probe``, polled."""
    async with asyncio.timeout(within):
        while not (value := await probe()):  # noqa: ASYNC110 (a database read, no event)
            await asyncio.sleep(0.005)
    return value


TOOL_TURN = '#text Let me read it.\n#tool read {"path": "README.md"}\n---\n#text done'


async def test_the_reads_return_what_the_runtime_wrote(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    from protocol import SessionQuery
    from protocol.requests import CreateSessionInput, PromptInput

    async with runtime_on(store_factory, tmp_path) as rt:
        q = rt.store.queries
        s = await rt.sessions.create(CreateSessionInput(title="reads"))
        assert (await q.session(s.id)).title == "reads"
        assert await q.session("ses_absent") is None

        await turn(rt, s.id, TOOL_TURN)
        page = await q.messages(s.id, "asc", 50, None)
        assert [m.type for m in page.data] == ["user", "assistant", "assistant"]
        tool = page.data[1].parts[-1]
        assert (tool.type, tool.name, tool.status) == ("tool", "read", "completed")
        assert "hello from the workdir" in str(tool.content)
        assert page.data[2].parts[-1].text == "done"
        assert [m.id for m in await q.context(s.id)] == [m.id for m in page.data]
        assert await q.message(s.id, page.data[1].id) == page.data[1]
        seqs = [await q.message_seq(s.id, m.id) for m in page.data]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == 3
        assert await q.newest_message(s.id) == page.data[-1].id

        # Pending input: admitted, not run.
        item = await rt.sessions.prompt(s.id, PromptInput(text="later", resume=False))
        assert [i.id for i in await q.inbox(s.id)] == [item.id]
        admitted = await q.admission(item.id)
        assert admitted is not None
        assert admitted.id == item.id
        await rt.sessions.cancel(s.id, item.id)
        assert await q.inbox(s.id) == []

        # While a step streams a tool call: a claim, an open step, an open tool call.
        slow = '#delay 20\n#chunk 1\n#tool read {"path": "README.md"}'
        await rt.sessions.prompt(s.id, PromptInput(text=slow))
        claims = await eventually(q.claims)
        assert [c.session_id for c in claims] == [s.id]
        assert await eventually(lambda: q.open_step(s.id)) is not None
        calls = await eventually(lambda: q.open_tool_calls(s.id))
        assert [(c.name, c.status) for c in calls] == [("read", "streaming")]
        await rt.execution.wait_idle(s.id)
        assert await q.claims() == []
        assert await q.open_tool_calls(s.id) == []
        assert await q.open_step(s.id) is None
        assert await q.tool_processes(s.id) == []
        assert await q.running_compaction(s.id) is None

        # Structure: a fork is listed and counted, but it is not a child.
        child = await rt.sessions.fork(s.id)
        assert (await q.session(child.id)).fork_boundary is not None
        assert await q.children(s.id) == []
        listed = await q.sessions(SessionQuery(limit=10), None)
        assert {x.id for x in listed.data} == {s.id, child.id}
        assert await q.session_count() == (2, 1)

        # Instruction entries written through the API.
        await rt.instructions.put(s.id, "style", "terse")
        assert await q.instruction_entries(s.id) == [("style", '"terse"')]


async def test_replaying_the_log_rebuilds_every_projection_exactly(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    from protocol.requests import (
        CreateSessionInput,
        PromptInput,
        UpdateSessionInput,
    )

    async with runtime_on(store_factory, tmp_path) as rt:
        s = await rt.sessions.create(CreateSessionInput(title="workload"))
        await turn(rt, s.id, TOOL_TURN)
        await turn(rt, s.id, "#text second answer\n#usage cost=0.5")
        await rt.instructions.put(s.id, "style", "terse")
        await rt.instructions.put(s.id, "limits", {"max": 3})
        await rt.instructions.remove(s.id, "limits")
        await turn(rt, s.id, "#text third, with instructions")
        fork = await rt.sessions.fork(s.id)
        await turn(rt, fork.id, "#text in the fork")
        await rt.sessions.compact(s.id)
        await rt.execution.wait_idle(s.id)
        await turn(rt, s.id, "#text after the compaction")
        messages = (await rt.sessions.messages(s.id, order="asc", limit=200)).data
        users = [m for m in messages if m.type == "user"]
        await rt.reverts.stage(s.id, users[-1].id, False)
        await rt.reverts.commit(s.id)
        await rt.sessions.update(s.id, UpdateSessionInput(title="renamed"))
        pending = await rt.sessions.prompt(s.id, PromptInput(text="never run", resume=False))
        cancelled = await rt.sessions.prompt(s.id, PromptInput(text="cancelled", resume=False))
        await rt.sessions.cancel(s.id, cancelled.id)
        gone = await rt.sessions.fork(fork.id)
        await rt.sessions.remove(gone.id)
        assert [i.id for i in await rt.sessions.pending(s.id)] == [pending.id]
        kinds = {m.type for m in (await rt.sessions.messages(s.id, order="asc", limit=200)).data}
        assert {"user", "assistant", "compaction"} <= kinds
    stored, rebuilt = await store_factory.rebuild(store_factory.database)
    assert stored == rebuilt
    # The workload really reached the projections the replay is compared on.
    assert len(stored["session"]) == 2
    for table in ("session_message", "session_part", "session_inbox", "instruction_state"):
        assert stored[table], table


async def test_the_cached_history_equals_a_full_read_after_every_change(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    """The history cache (rows changed since its last read) never drifts from a full read:
    through turns with tools, instruction updates, a staged revert (hidden rows), its
    clear, its commit (deleted rows), a compaction (the boundary moves) and a fork."""
    from protocol.requests import CreateSessionInput, PromptInput

    async with runtime_on(store_factory, tmp_path) as rt:
        q = rt.store.queries

        async def same(session_id: str) -> list[Any]:
            cached = await q.context(session_id)
            assert q.histories.get(session_id) is not None  # the incremental path was taken
            again = await q.context(session_id)  # nothing changed: all from the cache
            full = await q.full_context(session_id)
            assert cached == full
            assert again == full
            return full

        s = await rt.sessions.create(CreateSessionInput(title="cached"))
        assert await same(s.id) == []
        await turn(rt, s.id, TOOL_TURN)
        await turn(rt, s.id, "#text second answer")
        await rt.instructions.put(s.id, "style", "terse")
        await turn(rt, s.id, "#text third, with instructions")
        before = await same(s.id)
        users = [m for m in before if m.type == "user"]
        assert len(users) == 3

        await rt.reverts.stage(s.id, users[1].id, False)
        hidden = await same(s.id)
        assert [m.id for m in hidden] == [m.id for m in before if m.seq < users[1].seq]
        await rt.reverts.clear(s.id)
        assert await same(s.id) == before

        await rt.reverts.stage(s.id, users[2].id, False)
        await same(s.id)
        await rt.reverts.commit(s.id)
        committed = await same(s.id)
        assert [m.id for m in committed] == [m.id for m in before if m.seq < users[2].seq]

        await turn(rt, s.id, "#text after the revert")
        await rt.sessions.compact(s.id)
        await rt.execution.wait_idle(s.id)
        compacted = await same(s.id)
        assert compacted[0].type == "compaction"
        assert len(compacted) < len(committed)
        await turn(rt, s.id, "#text after the compaction")
        assert len(await same(s.id)) == len(compacted) + 2

        fork = await rt.sessions.fork(s.id)
        await same(fork.id)
        await turn(rt, fork.id, "#text in the fork")
        await same(fork.id)
        pending = await rt.sessions.prompt(s.id, PromptInput(text="not yet", resume=False))
        await rt.sessions.cancel(s.id, pending.id)
        await same(s.id)
        await rt.sessions.remove(fork.id)
        assert await q.context(fork.id) == []
        assert q.histories.get(fork.id) is None
