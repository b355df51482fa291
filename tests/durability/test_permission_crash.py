"""SIGKILL a real ``sessionrt serve`` while a call waits for a permission answer.

The call was asked (``session.permission.asked`` durable) and never answered.
The restarted server must never run it: recovery fails it as ``aborted``
(``executed: false``), its request leaves the pending list, and a late
answer is a 409, not a run. Exercises the generated client's permission calls.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from serve_proc import serving

from protocol.client import Client
from protocol.errors import ConflictError
from protocol.operations import LogQuery, PermissionReplyInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

T = TypeVar("T")
GUARD = 30.0
DEVNULL = asyncio.subprocess.DEVNULL


async def _polled(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """``read()`` again until ``done`` says so (under a guard, never the assertion)."""
    async with asyncio.timeout(GUARD):
        for _ in itertools.count():
            value = await read()
            if done(value):
                return value
            await asyncio.sleep(0.02)
    raise AssertionError("unreachable")


async def test_a_call_waiting_for_an_answer_at_a_crash_is_failed_never_run(
    tmp_path: Path,
) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    project.mkdir()
    data.mkdir(mode=0o700)
    (data / "agents.toml").write_text('[agents.asker.permissions]\nbash = "ask"\n')
    marker = project / "marker"
    command = json.dumps({"command": "touch marker"})
    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        session = await client.sessions.create(
            CreateSessionInput(agent="asker", location=Location(directory=str(project)))
        )
        await client.sessions.prompt(session.id, PromptInput(text=f"#tool bash {command}"))
        [asked] = await _polled(lambda: client.sessions.permissions(session.id), bool)
        assert asked.tool == "bash"
        assert asked.patterns == ("touch marker",)
        served.proc.send_signal(signal.SIGKILL)
        await served.proc.wait()
    assert not marker.exists()
    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        # Recovery resumes the session, failing the stale call first.
        await _polled(lambda: client.sessions.permissions(session.id), lambda p: not p)
        with pytest.raises(ConflictError):
            await client.sessions.reply_permission(
                session.id, asked.id, PermissionReplyInput(reply="once")
            )
        page = await client.sessions.messages(session.id)
        parts = [p for m in page.data for p in getattr(m, "parts", ())]
        [tool] = [p for p in parts if getattr(p, "id", None) == asked.call_id]
        assert tool.status == "error"
        assert tool.error["type"] == "aborted"
        log = [e async for e in client.sessions.log(session.id, LogQuery())]
        [failed] = [e.data["data"] for e in log if e.event == "session.tool.failed"]
        assert failed["id"] == asked.call_id
        assert failed["executed"] is False
        served.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.proc.wait(), GUARD) == 0
    assert not marker.exists()
