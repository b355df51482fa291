"""The recorder contract: every event-log backend must pass this module.

To add a backend, add a factory to ``BACKENDS``; nothing else here may depend
on SQLite.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pgdb
import pytest

from protocol import Location
from protocol import events as ev
from storage import (
    AppendConflictError,
    Command,
    DivergedError,
    NewEvent,
    ProjectionConflict,
    RecordedEvent,
    SeqConflictError,
    SQLiteStore,
)
from storage.postgres import PostgresStore

BACKENDS: dict[str, Callable[[Path], Any]] = {
    "sqlite-full": lambda tmp: SQLiteStore(tmp / "full.sqlite", synchronous="FULL"),
    "sqlite-normal": lambda tmp: SQLiteStore(tmp / "normal.sqlite", synchronous="NORMAL"),
    "postgresql": lambda url: PostgresStore(url),
}


@pytest.fixture(params=sorted(BACKENDS))
async def recorder(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "postgresql":
        async with pgdb.database() as url, BACKENDS[request.param](url) as r:
            yield r
        return
    async with BACKENDS[request.param](tmp_path) as r:
        yield r


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
