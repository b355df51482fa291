"""Shared fixtures: a real SQLite file per test, the store, and the session facade."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.inbox import Scope
from actors.sessions import Sessions
from storage import SQLiteStore


class WakeRecorder:
    """The wake hook as a recording fake: what the runtime would have been asked to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Scope]] = []

    def __call__(self, session_id: str, scope: Scope) -> None:
        self.calls.append((session_id, scope))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessionrt.sqlite"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(db_path) as s:
        yield s


@pytest.fixture
def wakes() -> WakeRecorder:
    return WakeRecorder()


@pytest.fixture
def sessions(store: SQLiteStore, wakes: WakeRecorder, tmp_path: Path) -> Sessions:
    return Sessions(store, wake=wakes, default_directory=str(tmp_path))
