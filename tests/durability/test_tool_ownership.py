"""SIGKILL a real ``sessionrt serve`` mid-tool: the tool's side effect never happens.

The bash command ``touch started; sleep 120; touch marker`` is running (``started``
is there) when the server dies. Its process group outlives the server (it runs on
under init); before the fix it finished and touched the marker while the log said
the call was aborted.
The restarted server's startup sweep, which runs before it binds, kills the
recorded group and only then fails the call as stale: once it is listening,
the group is gone, so the marker can never appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
from serve_proc import serving

from actors.tools._process import group_alive
from protocol.client import Client, follow_log
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

GUARD = 30.0
DEVNULL = asyncio.subprocess.DEVNULL


async def test_a_tool_running_when_the_server_is_killed_never_finishes(tmp_path: Path) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    project.mkdir()
    marker = project / "marker"
    started = project / "started"
    command = json.dumps({"command": "touch started; sleep 120; touch marker", "timeout_s": 300})
    pgid = None
    try:
        async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
            session = await client.sessions.create(
                CreateSessionInput(location=Location(directory=str(project)))
            )
            async with contextlib.aclosing(follow_log(client.sessions, session.id)) as log:
                await client.sessions.prompt(session.id, PromptInput(text=f"#tool bash {command}"))
                async with asyncio.timeout(GUARD):
                    async for event in log:
                        if event.event == "session.tool.spawned":
                            pgid = int(event.data["data"]["pgid"])
                            call_id = event.data["data"]["id"]
                            break
            assert pgid is not None
            # ``spawned`` is durable before the tool's gate opens: a kill right after it
            # may find the command not started yet (and the gate then never runs it).
            # Wait until it runs, so the kill lands on a command that would finish.
            async with asyncio.timeout(GUARD):
                while not started.exists():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            # The server alone: the tool has its own group.
            served.proc.send_signal(signal.SIGKILL)
            await served.proc.wait()
        # The premise: the command outlived its server.
        assert group_alive(pgid)
        async with serving(data, stderr=DEVNULL) as served:
            # Listening means the startup sweep is done: the group is gone for good.
            assert not group_alive(pgid)
            assert not marker.exists()
            async with Client(served.url) as client:
                page = await client.sessions.messages(session.id)
                parts = [p for m in page.data for p in getattr(m, "parts", ())]
                [tool] = [p for p in parts if getattr(p, "id", None) == call_id]
                assert tool.status == "error"
                assert tool.error["type"] == "aborted"
            served.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(served.proc.wait(), GUARD) == 0
    finally:
        if pgid is not None and group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
    assert not marker.exists()
