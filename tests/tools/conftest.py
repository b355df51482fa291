"""Fixtures for the tool tests: a Location, a managed output dir, contexts, the actor pool.

Everything is real: files under ``tmp_path``, pooled pykka call actors (each
with its worker thread), and (in the bash tests) real subprocesses. ``runner`` is the
:class:`ToolActors` pool the executor runs calls in; ``blocking`` is the plain
executor for the tests' own file reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors import BlockingExecutor
from actors.tools import (
    OutputBounding,
    ToolActors,
    ToolContext,
    ToolExecutor,
    ToolRegistry,
    builtin_tools,
)

MakeCtx = Callable[..., ToolContext]


@pytest.fixture
def location(tmp_path: Path) -> Path:
    path = tmp_path / "location"
    path.mkdir()
    return path


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    # Not created: bounding creates it on first use.
    return tmp_path / "tool-output"


@pytest.fixture
def make_ctx(location: Path, output_dir: Path) -> MakeCtx:
    def make(**overrides: Any) -> ToolContext:
        fields: dict[str, Any] = {
            "session_id": "ses_test",
            "call_id": "call_1",
            "assistant_message_id": "msg_test",
            "directory": location,
            "output_dir": output_dir,
        }
        fields.update(overrides)
        return ToolContext(**fields)

    return make


@pytest.fixture
def ctx(make_ctx: MakeCtx) -> ToolContext:
    return make_ctx()


@pytest.fixture
async def runner(loop_hygiene: None, blocking: BlockingExecutor) -> AsyncIterator[ToolActors]:
    async with ToolActors(blocking=blocking, limit=4) as r:
        yield r
    # Every child actor the calls used has stopped.
    assert pykka.ActorRegistry.get_all() == []


@pytest.fixture
async def blocking() -> AsyncIterator[BlockingExecutor]:
    async with BlockingExecutor(limit=2) as b:
        yield b


@pytest.fixture
def bounding(output_dir: Path) -> OutputBounding:
    return OutputBounding(output_dir=output_dir)


@pytest.fixture
def executor(runner: ToolActors, bounding: OutputBounding) -> ToolExecutor:
    return ToolExecutor(ToolRegistry(builtin_tools()), runner, bounding)
