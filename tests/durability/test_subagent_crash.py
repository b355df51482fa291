"""SIGKILL a real ``sessionrt serve`` while a subagent's child session runs.

The parent's ``task`` call is running and its child is in its first step
when the server dies. The restarted server's startup sweep fails the
orphaned child's claim (``aborted``) and resumes the parent, whose drain
fails the running ``task`` call as stale: the child's work is never started
again, by a replay of the call or otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

import pytest
from serve_proc import serving

from protocol.client import Client, follow_log
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import AssistantMessage, Location, ToolPart

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

GUARD = 30.0
DEVNULL = asyncio.subprocess.DEVNULL


async def test_a_child_running_when_the_server_is_killed_is_failed_and_never_replayed(
    tmp_path: Path,
) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    project.mkdir()
    brief = json.dumps({"description": "slow work", "prompt": "#delay 600000\n#text never"})
    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        parent = await client.sessions.create(
            CreateSessionInput(location=Location(directory=str(project)))
        )
        await client.sessions.prompt(parent.id, PromptInput(text=f"#tool task {brief}"))
        async with asyncio.timeout(GUARD):
            children = ()
            while not children:
                children = await client.sessions.children(parent.id)
                await asyncio.sleep(0.01)  # a poll of the route; the guard bounds it
        (child,) = children
        async with (
            contextlib.aclosing(follow_log(client.sessions, child.id)) as log,
            asyncio.timeout(GUARD),
        ):
            async for event in log:
                if event.event == "session.step.started":
                    break
        served.proc.send_signal(signal.SIGKILL)
        await served.proc.wait()

    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        # Listening means the startup sweep ran; the parent resumes after it.
        async with (
            contextlib.aclosing(follow_log(client.sessions, parent.id)) as log,
            asyncio.timeout(GUARD),
        ):
            async for event in log:
                if event.event == "session.execution.succeeded":
                    break
        page = await client.sessions.messages(parent.id)
        calls = [
            p
            for m in page.data
            if isinstance(m, AssistantMessage)
            for p in m.parts
            if isinstance(p, ToolPart)
        ]
        (call,) = calls  # one task call, failed as stale, never made again
        assert call.name == "task"
        assert call.status == "error"
        assert call.error is not None
        assert call.error["type"] == "aborted"

        child_log = [e.event async for e in client.sessions.log(child.id)]
        # Its one step, cut off by the kill; its claim failed by the sweep; no rerun.
        assert child_log.count("session.step.started") == 1
        assert child_log.count("session.execution.started") == 1
        assert child_log[-2:] == ["session.execution.failed", "log.synced"]
        (only,) = await client.sessions.children(parent.id)
        assert only.id == child.id
        assert await client.sessions.active() == {}
        served.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.proc.wait(), GUARD) == 0
