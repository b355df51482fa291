"""A real runtime on a temp data dir: SQLite file, scripted model, real tools."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from feed import Feed

from actors.runtime import Runtime, RuntimeConfig


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
async def runtime(tmp_path: Path, workdir: Path) -> AsyncIterator[Runtime]:
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Runtime(config) as rt:
        yield rt


@pytest.fixture
def feed(runtime: Runtime) -> Feed:
    f = Feed()
    runtime.bus.subscribe(f)
    return f


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None, slow_callbacks: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene and slow_callbacks."""
