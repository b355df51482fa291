"""SQLite-specific behaviour of the store: files, pragmas, locks, lifecycle, migrations."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import Location
from protocol import events as ev
from protocol.shapes import SessionRevert
from storage import (
    SCHEMA_VERSION,
    SESSION_BUCKET_MS,
    Command,
    ProjectionConflict,
    RecordedEvent,
    SQLiteStore,
    StorageBrokenError,
    StoreClosedError,
    StoreLockedError,
    no_staged_revert,
)
from storage._writer import _INSERT_EVENT


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


async def test_events_survive_reopening(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        written = await store.append(Command.of(created("ses_a")))
    async with SQLiteStore(db_path) as store:
        assert await store.read("ses_a") == written
        more = await store.append(Command.of(created("ses_b")))
        assert more[0].position == written[0].position + 1


async def test_the_file_is_wal_with_full_sync_by_default(store: SQLiteStore) -> None:
    async with store.reader() as conn:
        rows = list(await conn.execute_fetchall("PRAGMA journal_mode"))
    assert rows[0][0] == "wal"
    assert store.synchronous == "FULL"


async def test_readers_are_read_only(store: SQLiteStore) -> None:
    with pytest.raises(sqlite3.OperationalError):
        await store.fetch("DELETE FROM event")


async def test_subscribers_are_told_only_after_commit(store: SQLiteStore, db_path: Path) -> None:
    visible: list[int] = []

    def check(records: list[RecordedEvent]) -> None:
        # An independent connection sees the rows: they are committed.
        conn = sqlite3.connect(db_path)
        try:
            visible.append(conn.execute("SELECT count(*) FROM event").fetchone()[0])
        finally:
            conn.close()

    store.subscribe(check)  # type: ignore[arg-type]
    await store.append(Command.of(created("ses_a")))
    assert visible == [1]


async def test_a_second_process_cannot_open_the_writer(store: SQLiteStore, db_path: Path) -> None:
    with pytest.raises(StoreLockedError):
        async with SQLiteStore(db_path):
            pass


async def test_lifecycle_is_explicit(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    with pytest.raises(StoreClosedError):
        await store.append(Command.of(created("ses_a")))
    async with store:
        with pytest.raises(StoreClosedError):
            await store.open()
    assert not store.is_open
    with pytest.raises(StoreClosedError):
        await store.append(Command.of(created("ses_a")))
    with pytest.raises(StoreClosedError):
        await store.read("ses_a")
    await store.close()  # closing twice is harmless


async def test_close_waits_for_submitted_commands(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    await store.open()
    appends = [
        asyncio.ensure_future(store.append(Command.of(created(f"ses_{i}")))) for i in range(200)
    ]
    await asyncio.sleep(0)  # let every append enter the queue
    await store.close()
    results = await asyncio.gather(*appends)
    assert len(results) == 200
    async with SQLiteStore(db_path) as reopened:
        assert len(await reopened.read_all(limit=1000)) == 200


async def test_cancelling_an_appender_does_not_withdraw_its_command(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        task = asyncio.ensure_future(store.append(Command.of(created("ses_a"))))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.append(Command.of(created("ses_b")))  # queued behind it
        assert await store.last_seq("ses_a") == 1


async def test_a_failing_command_whose_appender_was_cancelled_stays_quiet(
    db_path: Path, loop_hygiene: None
) -> None:
    async with SQLiteStore(db_path) as store:
        task = asyncio.ensure_future(
            store.append(Command.of(ev.SessionRenamed(session_id="ses_nobody", title="x")))
        )
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.append(Command.of(created("ses_b")))  # its batch has ended
        assert await store.last_seq("ses_nobody") == 0


async def test_schema_version_is_recorded_once(db_path: Path) -> None:
    async with SQLiteStore(db_path):
        pass
    async with SQLiteStore(db_path) as store:
        rows = await store.fetch("SELECT version FROM schema_version")
    assert [tuple(r) for r in rows] == [(SCHEMA_VERSION,)]


async def test_a_newer_schema_is_refused(db_path: Path) -> None:
    async with SQLiteStore(db_path):
        pass
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StorageBrokenError, match="newer"):
        async with SQLiteStore(db_path):
            pass


async def test_unknown_stored_types_are_read_but_not_decoded(
    store: SQLiteStore, db_path: Path
) -> None:
    await store.append(Command.of(created("ses_a")))
    await store.close()
    conn = sqlite3.connect(db_path)
    conn.execute(
        "INSERT INTO event (id, aggregate_id, seq, type, created, data)"
        " VALUES ('evt_future', 'ses_a', 2, 'session.future.7', 1, '{}')"
    )
    conn.commit()
    conn.close()
    async with SQLiteStore(db_path) as reopened:
        records = await reopened.read("ses_a")
        assert [r.event is None for r in records] == [False, True]
        # The writer continues after the unknown row: seq stays gapless.
        more = await reopened.append(Command.of(ev.SessionRenamed(session_id="ses_a", title="x")))
        assert more[0].seq == 3


async def test_a_version_1_database_is_migrated_forward(db_path: Path) -> None:
    from storage import schema

    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for statement in schema.MIGRATIONS[0].script("sqlite").split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.execute(
        "INSERT INTO session (id, title, directory, time_created, time_updated)"
        " VALUES ('ses_old', 'old', '/', 1, 1)"
    )
    conn.close()
    async with SQLiteStore(db_path) as store:
        rows = await store.fetch("SELECT version FROM schema_version")
        assert rows[0][0] == SCHEMA_VERSION >= 2
        claim = await store.fetch(
            "SELECT time_claimed, resume_attempts FROM session WHERE id = 'ses_old'"
        )
        assert tuple(claim[0]) == (None, 0)
        session = await store.queries.session("ses_old")
        assert session is not None
        assert session.title == "old"


async def test_a_failing_projector_fails_its_command_and_the_writer_goes_on(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage import projectors

    def broken(rec: RecordedEvent, e: ev.SessionRenamed) -> tuple[projectors.Op, ...]:
        raise RuntimeError("projector bug")

    await store.append(Command.of(created("ses_a")))
    monkeypatch.setitem(projectors._PROJECTORS, ev.SessionRenamed, broken)
    results = await asyncio.gather(
        store.append(Command.of(ev.SessionRenamed(session_id="ses_a", title="x"))),
        store.append(Command.of(created("ses_b"))),
        return_exceptions=True,
    )
    assert isinstance(results[0], RuntimeError)
    assert not isinstance(results[1], BaseException)
    assert await store.last_seq("ses_a") == 1  # nothing of the failed command stayed
    monkeypatch.undo()
    more = await store.append(Command.of(ev.SessionRenamed(session_id="ses_a", title="y")))
    assert more[0].seq == 2


async def test_a_read_only_store_reads_and_changes_nothing(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        written = await store.append(Command.of(created("ses_a")))
    before = sqlite3.connect(db_path).execute("SELECT * FROM event").fetchall()
    async with SQLiteStore(db_path, read_only=True) as reader:
        assert await reader.read("ses_a") == written
        assert (await reader.queries.session("ses_a")) is not None
        with pytest.raises(StoreClosedError, match="read-only"):
            await reader.append(Command.of(created("ses_b")))
        # No writer may start under a reader, so nothing it reads goes stale unseen.
        with pytest.raises(StoreLockedError):
            async with SQLiteStore(db_path):
                pass
    assert sqlite3.connect(db_path).execute("SELECT * FROM event").fetchall() == before
    async with SQLiteStore(db_path):  # the reader is gone: a writer may start again
        pass


async def test_a_read_only_store_refuses_while_a_writer_runs(db_path: Path) -> None:
    async with SQLiteStore(db_path):
        with pytest.raises(StoreLockedError):
            async with SQLiteStore(db_path, read_only=True):
                pass


async def test_a_read_only_store_creates_no_database(tmp_path: Path) -> None:
    path = tmp_path / "none.sqlite"
    with pytest.raises(StorageBrokenError):
        async with SQLiteStore(path, read_only=True):
            pass
    # The failed reader's thread has ended too: left running, it would answer
    # its stop on this loop after the test had closed it (a thread exception).
    assert not [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]
    assert not path.exists()
    assert not Path(f"{path}.lock").exists()  # noqa: ASYNC240


async def test_children_are_looked_up_through_the_parent_index(db_path: Path) -> None:
    # The index holds children only (v13: WHERE parent_id IS NOT NULL); a
    # lookup by parent id must still be able to use it.
    async with SQLiteStore(db_path) as store:
        await store.append(Command.of(created("ses_root")))
        child = ev.SessionCreated(
            session_id="ses_child",
            parent_id="ses_root",
            title="t",
            location=Location(directory="/"),
        )
        await store.append(Command.of(child))
        assert await store.queries.children("ses_root") == ["ses_child"]
        async with store.reader() as conn:
            plan = await conn.execute_fetchall(
                "EXPLAIN QUERY PLAN SELECT id FROM session WHERE parent_id = ?", ("ses_root",)
            )
            [[indexed]] = await conn.execute_fetchall(
                "SELECT count(*) FROM session INDEXED BY session_parent WHERE parent_id = ?",
                ("ses_root",),
            )
    assert any("USING INDEX session_parent" in str(row[-1]) for row in plan)
    assert indexed == 1


async def test_the_session_list_is_read_in_its_index_order(db_path: Path) -> None:
    # SQLite has no HOT updates to win, so its list index holds the whole order
    # (v14: time_bucket, time_updated, id): no sort step for a page.
    async with SQLiteStore(db_path) as store:
        await store.append(Command.of(created("ses_a")))
        async with store.reader() as conn:
            plan = await conn.execute_fetchall(
                "EXPLAIN QUERY PLAN SELECT id FROM session WHERE time_bucket <= ?"
                " AND (time_updated, id) < (?, ?)"
                " ORDER BY time_bucket DESC, time_updated DESC, id DESC LIMIT 3",
                (60, 60_000, "ses_x"),
            )
            [[bucket, updated]] = await conn.execute_fetchall(
                "SELECT time_bucket, time_updated FROM session"
            )
    details = [str(row[-1]) for row in plan]
    assert any("session_updated" in d for d in details)
    assert not any("TEMP B-TREE" in d for d in details)
    assert bucket == updated // SESSION_BUCKET_MS


async def test_a_grouped_projection_falling_short_fails_only_its_command(
    store: SQLiteStore,
) -> None:
    # Renames of several sessions in one batch run as one executemany; the one
    # whose session is missing fails alone, with its own reason, and the
    # others commit with their projections.
    await asyncio.gather(*(store.append(Command.of(created(f"ses_{i}"))) for i in range(4)))
    renames = [f"ses_{i}" for i in (0, 1, 9, 2, 3)]
    results = await asyncio.gather(
        *(
            store.append(Command.of(ev.SessionRenamed(session_id=s, title=f"new {s}")))
            for s in renames
        ),
        return_exceptions=True,
    )

    failed = [s for s, r in zip(renames, results, strict=True) if isinstance(r, BaseException)]
    assert failed == ["ses_9"]
    assert isinstance(results[2], ProjectionConflict)
    assert results[2].reason == "session.missing"
    assert await store.last_seq("ses_9") == 0
    for i in range(4):
        session = await store.queries.session(f"ses_{i}")
        assert session is not None
        assert session.title == f"new ses_{i}"
        assert await store.last_seq(f"ses_{i}") == 2


class _CountingConnection:
    """The writer's connection, counting the statements that insert event rows."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.event_statements: list[int] = []  # rows per statement

        self.statements: list[str] = []  # every statement's text, in order

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.statements.append(sql)
        if sql == _INSERT_EVENT:
            self.event_statements.append(1)
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        rows = list(rows)
        self.statements.append(sql)
        if sql == _INSERT_EVENT:
            self.event_statements.append(len(rows))
        return self.conn.executemany(sql, rows)


@contextlib.contextmanager
def _counting(store: SQLiteStore) -> Iterator[_CountingConnection]:
    writer = store._writer
    assert writer is not None
    assert writer._conn is not None
    counting = _CountingConnection(writer._conn)
    writer._conn = counting  # type: ignore[assignment]  # the writer is idle between batches
    try:
        yield counting
    finally:
        writer._conn = counting.conn


def _prompt(session_id: str, inbox_id: str) -> Command:
    enqueued = ev.InboxEnqueued(
        session_id=session_id,
        inbox_id=inbox_id,
        item=ev.EnqueuedItem(type="user", payload={"text": "hi"}, delivery="steer"),
    )
    return Command.of(enqueued, checks=(no_staged_revert(session_id),))


async def test_a_prompts_check_and_its_touch_of_the_session_are_one_statement(
    store: SQLiteStore,
) -> None:
    sessions = [f"ses_{i}" for i in range(4)]
    await store.append(Command.of(*(created(s) for s in sessions)))
    with _counting(store) as counting:
        futures = [store.submit(_prompt(s, f"msg_{i}")) for i, s in enumerate(sessions)]
        records = await asyncio.gather(*futures)
    session_updates = [sql for sql in counting.statements if sql.startswith("UPDATE session ")]
    assert len(session_updates) == len(sessions)
    for s, (record,) in zip(sessions, records, strict=True):
        session = await store.queries.session(s)
        assert session is not None
        assert session.time.updated == record.created
        assert [item.id for item in await store.queries.inbox(s)] == [record.event.inbox_id]


async def test_a_batch_of_checked_prompts_refuses_a_reverted_or_missing_session_alone(
    store: SQLiteStore,
) -> None:
    await store.append(Command.of(created("ses_a"), created("ses_b")))
    staged = ev.RevertStaged(session_id="ses_b", revert=SessionRevert(message_id="msg_x"))
    await store.append(Command.of(staged))
    futures = [
        store.submit(_prompt("ses_a", "msg_1")),
        store.submit(_prompt("ses_b", "msg_2")),
        store.submit(_prompt("ses_none", "msg_3")),
        store.submit(_prompt("ses_a", "msg_4")),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    for refused in (results[1], results[2]):
        assert isinstance(refused, ProjectionConflict)
        assert refused.reason == "session.reverted"
    assert [isinstance(r, BaseException) for r in results] == [False, True, True, False]
    assert [item.id for item in await store.queries.inbox("ses_a")] == ["msg_1", "msg_4"]
    assert await store.queries.inbox("ses_b") == []
    assert await store.last_seq("ses_b") == 2
    assert await store.last_seq("ses_none") == 0


async def test_checked_commands_of_one_batch_write_their_event_rows_in_one_statement(
    store: SQLiteStore,
) -> None:
    # A prompt's command carries a check (no staged revert); the checks run in
    # line with the projection ops, so the batch's event rows still go in one
    # statement instead of one flushed ahead of each check.
    sessions = [f"ses_{i}" for i in range(5)]
    await store.append(Command.of(*(created(s) for s in sessions)))
    with _counting(store) as counting:
        futures = [
            store.submit(
                Command.of(
                    ev.SessionRenamed(session_id=s, title=f"new {s}"),
                    checks=(no_staged_revert(s),),
                )
            )
            for s in sessions
        ]
        await asyncio.gather(*futures)
    assert counting.event_statements == [len(sessions)]


async def test_a_check_sees_what_an_earlier_command_of_its_batch_wrote(
    store: SQLiteStore,
) -> None:
    await store.append(Command.of(created("ses_a"), created("ses_b")))
    staged = ev.RevertStaged(session_id="ses_a", revert=SessionRevert(message_id="msg_x"))
    futures = [
        store.submit(Command.of(ev.SessionRenamed(session_id="ses_a", title="before"))),
        store.submit(Command.of(staged)),
        store.submit(
            Command.of(
                ev.SessionRenamed(session_id="ses_a", title="after"),
                checks=(no_staged_revert("ses_a"),),
            )
        ),
        store.submit(
            Command.of(
                ev.SessionRenamed(session_id="ses_b", title="other"),
                checks=(no_staged_revert("ses_b"),),
            )
        ),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[2], ProjectionConflict)
    assert results[2].reason == "session.reverted"
    assert [isinstance(r, BaseException) for r in results] == [False, False, True, False]
    a = await store.queries.session("ses_a")
    b = await store.queries.session("ses_b")
    assert a is not None
    assert a.title == "before"
    assert a.revert is not None
    assert b is not None
    assert b.title == "other"
