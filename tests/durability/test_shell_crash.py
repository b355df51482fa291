"""SIGKILL a real ``sessionrt serve`` while a user shell runs.

The shell's process group was recorded (``session.shell.spawned``) before its
command could run. The restarted server kills that group before it records the
shell as ``cancelled``: the command never gets to its side effect, and no
process of it is left.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from pathlib import Path

import pytest
from proc_groups import alive
from serve_proc import serving

from actors.session.shells import CANCELLED_TEXT
from actors.tools._process import group_alive
from protocol.client import Client
from protocol.operations import ShellInput
from protocol.requests import CreateSessionInput
from protocol.shapes import Location, ShellMessage

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

GUARD = 30.0
DEVNULL = asyncio.subprocess.DEVNULL


async def _shell(client: Client, session_id: str) -> ShellMessage:
    page = await client.sessions.messages(session_id)
    [shell] = [m for m in page.data if isinstance(m, ShellMessage)]
    return shell


async def test_a_shell_running_at_a_crash_is_killed_then_cancelled(tmp_path: Path) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    project.mkdir()
    data.mkdir(mode=0o700)
    pidfile = project / "pid"
    # The command waits for ``go`` (made after the restart), not for a time: a
    # restart slower than a fixed sleep (a loaded machine) let it reach the touch.
    command = "echo $$ > pid; while [ ! -e go ]; do sleep 0.05; done; touch marker"
    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        session = await client.sessions.create(
            CreateSessionInput(location=Location(directory=str(project)))
        )
        await client.sessions.shell(session.id, ShellInput(id="msg_crashshell1", command=command))
        async with asyncio.timeout(GUARD):  # a guard, never the assertion
            for _ in itertools.count():
                if pidfile.exists() and pidfile.read_text().strip():
                    break
                await asyncio.sleep(0.02)
        pid = int(pidfile.read_text())
        group = os.getpgid(pid)
        served.proc.send_signal(signal.SIGKILL)
        await served.proc.wait()
    assert alive(pid)  # the crash alone leaves the command running under init
    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        async with asyncio.timeout(GUARD):
            for _ in itertools.count():
                shell = await _shell(client, session.id)
                if shell.shell.state != "running":
                    break
                await asyncio.sleep(0.02)
        assert shell.shell.state == "cancelled"
        assert shell.output == CANCELLED_TEXT
        # Killed before the cancellation was recorded: gone now, not later.
        assert not alive(pid)
        served.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.proc.wait(), GUARD) == 0
    # Nothing of the command's group is left to reach the touch once ``go`` exists.
    assert not group_alive(group)
