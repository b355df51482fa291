"""Short SQLite reads run on the loop's thread; a long or blocked one moves to a reader thread.

Real files, real connections: the budget is made to run out by a query that
does a lot of SQLite work, and BUSY by a lock another connection holds.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from protocol import Location
from protocol import events as ev
from storage import Command, SQLiteStore
from storage._inline_reads import InlineReader

#: Several hundred milliseconds of SQLite work: far past any budget.
LONG_QUERY = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000000)"
    " SELECT count(*), sum(x) FROM c"
)


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


async def test_a_short_read_is_answered_on_the_loop(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await store.append(Command.of(created("ses_a")))
        before = store.inline.answered
        rows = await store.fetch("SELECT id, title FROM session")
        [[(session,)]] = await store.fetch_many([("SELECT count(*) FROM session", ())])
        assert [tuple(r) for r in rows] == [("ses_a", "t")]
        assert session == 1
        assert store.inline.answered == before + 2
        assert store.inline.deferred == 0


async def test_a_read_past_the_budget_moves_to_a_thread_with_the_same_answer(
    db_path: Path,
) -> None:
    async with SQLiteStore(db_path) as store:
        await store.append(Command.of(created("ses_a")))
        [[count, total]] = await store.fetch(LONG_QUERY)
        assert (count, total) == (3_000_000, 3_000_000 * 3_000_001 // 2)
        assert store.inline.deferred == 1
        # Interrupted in a snapshot of its own, then read on a thread: the
        # connection is left outside any transaction, and the next short read
        # is answered on the loop again, seeing later commits.
        await store.append(Command.of(created("ses_b")))
        answered = store.inline.answered
        [[n]] = await store.fetch("SELECT count(*) FROM session")
        assert n == 2
        assert store.inline.answered == answered + 1


async def test_statements_read_together_keep_one_snapshot_when_one_runs_long(
    db_path: Path,
) -> None:
    async with SQLiteStore(db_path) as store:
        await store.append(Command.of(created("ses_a")))
        first, second = await store.fetch_many(
            [("SELECT count(*) FROM session", ()), (LONG_QUERY, ())]
        )
        assert first[0][0] == 1
        assert second[0][0] == 3_000_000
        assert store.inline.deferred == 1


def test_busy_sends_the_read_on_without_waiting(tmp_path: Path) -> None:
    """A rollback-journal file with an exclusive lock held: the inline reader
    waits for no lock (``timeout=0``), so it gives the read up at once."""
    path = tmp_path / "plain.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("INSERT INTO t VALUES (1)")
    reader = InlineReader(str(path), read_only=False)
    reader.adopt(reader.connect())
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert reader.fetch_many([("SELECT x FROM t", ())]) is None
        assert reader.deferred == 1
        holder.execute("COMMIT")
        assert reader.fetch_many([("SELECT x FROM t", ())]) == [[(1,)]]
        assert reader.answered == 1
    finally:
        reader.close()
        holder.close()


async def test_a_bad_statement_fails_as_it_did_on_a_thread(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store.fetch("SELECT * FROM no_such_table")
        with pytest.raises(sqlite3.ProgrammingError):
            await store.fetch("SELECT ?", ())  # a parameter missing
        [[one]] = await store.fetch("SELECT 1")
        assert one == 1


async def test_the_inline_connection_is_read_only(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        conn = store.inline._conn
        assert conn is not None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM session")
        assert (await store.fetch("SELECT 1"))[0][0] == 1


async def test_reads_yield_to_the_loop_like_a_thread_hop(db_path: Path) -> None:
    """A task that reads in a loop still lets others run between its reads."""
    async with SQLiteStore(db_path) as store:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        try:
            await asyncio.sleep(0)
            start = ticks
            for _ in range(50):
                await store.fetch("SELECT 1")
            assert store.inline.deferred == 0
            assert ticks - start >= 50
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_closing_the_store_closes_the_inline_connection(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    async with store:
        conn = store.inline._conn
        assert conn is not None
    assert store.inline._conn is None
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")
