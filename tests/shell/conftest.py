"""Fixtures for the user shell, environment and revert tests: real git repos in temp dirs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol.operations import LogQuery
from server.embedded import Embedded


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene."""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def tool(name: str, **args: Any) -> str:
    """A scripted-model line that calls tool ``name`` with ``args``."""
    return f"#tool {name} {json.dumps(args)}"


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (but .git) and its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git work tree with a committed file and a .gitignore."""
    path = tmp_path / "project"
    path.mkdir()
    git(path, "init", "-q")
    (path / ".gitignore").write_text("ignored/\n*.log\n")
    (path / "a.txt").write_text("alpha\n")
    (path / "keep.txt").write_text("untouched\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return path


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Embedded]:
    async with Embedded(tmp_path / "data") as oc:
        yield oc


async def until(oc: Embedded, session_id: str, type_: str, count: int = 1) -> list[Any]:
    """Follow the session's log until ``count`` events of ``type_``; their data."""
    seen: list[Any] = []
    async with asyncio.timeout(60):
        async for e in oc.sessions.log(session_id, LogQuery(follow=True)):
            if e.event == type_:
                seen.append(e.data["data"])
                if len(seen) == count:
                    return seen
    raise AssertionError(f"the log ended before {count} {type_}")
