"""Shared fixtures: a real SQLite file (or PostgreSQL database) per test, the store, and
the session facade. ``SESSIONRT_TEST_DATABASE=postgresql`` puts ``store`` on PostgreSQL
(see tests/pgdb.py)."""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pgdb
import proc_groups
import pytest
from hypothesis import settings
from loop_watch import SlowCallbacks

from actors.session.inbox import Scope
from actors.sessions import Sessions
from storage import SQLiteStore, is_server_url

# Hypothesis's per-example deadline (200 ms) is a timed assertion: on CI's 2
# cores shared by parallel xdist workers an example that takes 20 ms alone
# takes 300 ms, and the run fails as "flaky". Speed is for the benchmarks in
# scripts/; tests here assert behaviour, so no example has a deadline.
settings.register_profile("sessionrt", deadline=None)
settings.load_profile("sessionrt")

# Bytecode is kept for what this process and every child it starts imports, also
# when pytest is run directly: see scripts/test (a server start compiling ~600
# modules again cost as much CPU as the rest of its start).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


class WakeRecorder:
    """The wake hook as a recording fake: what the runtime would have been asked to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Scope]] = []

    def wake(self, session_id: str, scope: Scope) -> None:
        self.calls.append((session_id, scope))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessionrt.sqlite"


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """A fresh, migrated PostgreSQL database of this test's own (skips without a server)."""
    async with pgdb.database() as url:
        yield url


@pytest.fixture
async def store(request: pytest.FixtureRequest, db_path: Path) -> AsyncIterator[Any]:
    if pgdb.on_postgres() and not request.node.get_closest_marker("sqlite_only"):
        from storage.postgres import PostgresStore

        async with pgdb.database() as url, PostgresStore(url) as p:
            yield p
        return
    async with SQLiteStore(db_path) as s:
        yield s


@pytest.fixture(autouse=True)
def _postgres_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """On the PostgreSQL pass, every runtime a test opens keeps its log in the test's own
    database (the backend choice is the only thing changed; the server is real).

    Not for a test that names its backend itself (the store contract's
    ``store_factory``, one parameter per backend): its SQLite runs must stay on
    SQLite, or they would read back a file nobody wrote.
    """
    if (
        not pgdb.on_postgres()
        or request.node.get_closest_marker("sqlite_only")
        or "store_factory" in request.fixturenames
    ):
        yield
        return
    from actors import runtime as runtime_module

    url = asyncio.run(pgdb.new_database())
    connect = runtime_module.connect

    def to_postgres(database: str, **options: Any) -> Any:
        return connect(database if is_server_url(database) else url, **options)

    monkeypatch.setattr(runtime_module, "connect", to_postgres)
    try:
        yield
    finally:
        asyncio.run(pgdb.release(url))


def pytest_configure(config: pytest.Config) -> None:
    """In the process that runs tests (not xdist's controller, whose children are the
    workers): note every child spawned, to kill what is left of them however the run ends.
    Everywhere, a child started from the main thread dies with its parent."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        proc_groups.note_spawned()
        atexit.register(proc_groups.reap_all)
        proc_groups.reap_on_termination()
    else:  # the controller: its workers die with it, and theirs with them
        proc_groups.note_spawned(record=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (every test module, its imports, the items).

    ``loop_hygiene`` runs a full collection after each test to surface dropped
    futures; over the ~277k objects a whole collected suite keeps alive, that cost
    0.2 s a test, half the suite's time. Frozen objects are never traversed again,
    while everything a test makes is still collected and checked after it.
    """
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first (in their order), so xdist starts them while the
    quick ones fill the other workers, instead of one of them ending the run alone.
    On the PostgreSQL pass, leave out what would run exactly as it did on SQLite."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    if not pgdb.on_postgres():
        return
    same = [item for item in items if item.get_closest_marker("sqlite_only")]
    if same:
        config.hook.pytest_deselected(items=same)
        items[:] = [item for item in items if not item.get_closest_marker("sqlite_only")]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    proc_groups.reap_all()  # also after a KeyboardInterrupt: no `sessionrt` outlives the run
    if pgdb.template_made():
        asyncio.run(pgdb.drop_all())


@pytest.fixture
def wakes() -> WakeRecorder:
    return WakeRecorder()


@pytest.fixture
async def sessions(
    store: SQLiteStore, wakes: WakeRecorder, tmp_path: Path
) -> AsyncIterator[Sessions]:
    facade = Sessions(store, wake=wakes, default_directory=str(tmp_path))
    yield facade
    await facade.aclose()


@pytest.fixture
def slow_callbacks() -> Iterator[SlowCallbacks]:
    """The test fails if one callback of its loop used more than
    ``loop_watch.THRESHOLD_S`` of CPU (see tests/loop_watch.py: the threshold,
    why CPU time, and the allow-list)."""
    with SlowCallbacks() as watch:
        yield watch
    offenders = watch.offenders()
    assert not offenders, f"callbacks held the event loop: {offenders}"


@pytest.fixture
async def loop_hygiene() -> AsyncIterator[None]:
    """No task outlives the test and nothing reaches the loop's exception handler.

    Leaked tasks and "exception was never retrieved" are bugs no assertion
    sees, so directories that own tasks and threads use this for every test.
    """
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    yield
    # A dropped future with an unread exception only reports when it is collected.
    gc.collect()
    loop.set_exception_handler(previous)
    leftover = asyncio.all_tasks() - {asyncio.current_task()}
    assert not leftover, f"tasks outlived the test: {leftover}"
    assert not reported, f"the loop's exception handler was called: {reported}"
