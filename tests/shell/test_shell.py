"""User shell commands: background work owned by the host, one transcript entry, a notice."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from actors.runtime import Runtime, RuntimeConfig
from actors.session.shells import CANCELLED_TEXT, notice_id
from protocol import SessionNotFoundError
from protocol.errors import InvalidRequestError
from protocol.operations import EnvironmentInput, ShellInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location
from server.embedded import Embedded
from tests.shell.conftest import until


async def test_shell_output_exit_entry_and_notice(host: Embedded, repo: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await host.sessions.shell(s.id, ShellInput(id="msg_shell1", command="cat a.txt; exit 3"))
    (ended,) = await until(host, s.id, "session.shell.ended")
    assert ended["shell"]["state"] == "failed"
    assert ended["shell"]["exit"] == 3
    assert ended["output"] == "alpha\n"
    page = await host.sessions.messages(s.id, None)
    shells = [m for m in page.data if m.type == "shell"]
    assert len(shells) == 1
    assert shells[0].id == "msg_shell1"
    assert shells[0].output == "alpha\n"
    # The notice waits in the inbox as synthetic input, without waking execution.
    (item,) = await host.sessions.inbox(s.id)
    assert item.id == notice_id("msg_shell1")
    assert item.type == "synthetic"
    assert item.payload["resume"] is False
    assert item.payload["metadata"] == {
        "source": "shell",
        "jobID": "msg_shell1",
        "shellID": "msg_shell1",
        "state": "failed",
        "exit": 3,
    }
    assert "alpha" in item.payload["text"]
    assert await host.runtime.execution.active() == []


async def test_the_notice_quotes_the_command_in_its_attribute(host: Embedded, repo: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    command = 'echo "<done>" & true'
    await host.sessions.shell(s.id, ShellInput(command=command))
    await until(host, s.id, "session.shell.ended")
    (item,) = await host.sessions.inbox(s.id)
    head = item.payload["text"].split("\n", 1)[0]
    assert head.endswith(' command="echo &quot;&lt;done&gt;&quot; &amp; true">')


async def test_shell_retry_with_same_id_runs_once(host: Embedded, repo: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await host.sessions.shell(s.id, ShellInput(id="msg_once", command="echo x >> count"))
    await until(host, s.id, "session.shell.ended")
    await host.sessions.shell(s.id, ShellInput(id="msg_once", command="echo x >> count"))
    assert (repo / "count").read_text() == "x\n"


async def test_large_output_is_bounded_with_managed_file(host: Embedded, repo: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await host.sessions.shell(s.id, ShellInput(command="seq 1 100000"))
    (ended,) = await until(host, s.id, "session.shell.ended")
    assert ended["shell"]["state"] == "completed"
    assert len(ended["output"].encode()) < 60 * 1024
    assert ended["output"].startswith("1\n2\n")
    assert ended["output"].rstrip().endswith("100000")
    assert "truncated; full content saved to" in ended["output"]


async def test_environment_reaches_shell_but_server_secrets_do_not(
    host: Embedded, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVER_API_KEY", "server-secret")
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await host.sessions.environment(s.id, EnvironmentInput(variables={"GREETING": "hi there"}))
    await host.sessions.shell(s.id, ShellInput(command='echo "$GREETING/${SERVER_API_KEY:-none}"'))
    (ended,) = await until(host, s.id, "session.shell.ended")
    assert ended["output"] == "hi there/none\n"
    # Replaced, not merged.
    await host.sessions.environment(s.id, EnvironmentInput(variables={"OTHER": "1"}))
    await host.sessions.shell(s.id, ShellInput(command='echo "${GREETING:-gone}"'))
    second = await until(host, s.id, "session.shell.ended", 2)
    assert second[1]["output"] == "gone\n"


async def test_environment_rejects_bad_names_and_unknown_sessions(host: Embedded) -> None:
    s = await host.sessions.create()
    with pytest.raises(InvalidRequestError):
        await host.sessions.environment(s.id, EnvironmentInput(variables={"A=B": "1"}))
    with pytest.raises(SessionNotFoundError):
        await host.sessions.environment("ses_missing", EnvironmentInput(variables={}))
    with pytest.raises(SessionNotFoundError):
        await host.sessions.shell("ses_missing", ShellInput(command="true"))


async def test_shutdown_kills_shell_and_next_start_cancels_it_once(
    tmp_path: Path, repo: Path
) -> None:
    config = RuntimeConfig(data_dir=tmp_path / "data")
    async with Embedded(config=config) as oc:
        s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        await oc.sessions.shell(
            s.id, ShellInput(id="msg_long", command="echo $$ > pid; exec sleep 600")
        )
        await until(oc, s.id, "session.shell.started")
        while not (repo / "pid").exists() or not (repo / "pid").read_text().strip():
            await oc.sessions.get(s.id)  # yields to the loop; the shell writes its pid
        pid = int((repo / "pid").read_text())
    # The host's shutdown killed the command (no orphan keeps running).
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    for _ in range(2):  # repeated recovery never duplicates the notice
        async with Runtime(config) as rt:
            items = await rt.sessions.pending(s.id)
            assert [i.id for i in items] == [notice_id("msg_long")]
            assert items[0].payload["metadata"]["state"] == "cancelled"
            assert CANCELLED_TEXT in items[0].payload["text"]
            (entry,) = [m for m in await rt.sessions.context(s.id) if m.type == "shell"]
            assert entry.type == "shell"
            assert entry.shell.state == "cancelled"


async def test_bash_tool_gets_the_session_environment(
    host: Embedded, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVER_TOKEN", "server-secret")
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await host.sessions.environment(s.id, EnvironmentInput(variables={"GREETING": "from-env"}))
    command = 'echo "$GREETING/${SERVER_TOKEN:-none}" > out.txt'
    await host.sessions.prompt(
        s.id, PromptInput(text="#tool bash " + json.dumps({"command": command}) + "\n---\n#text")
    )
    await host.sessions.wait(s.id)
    assert (repo / "out.txt").read_text() == "from-env/none\n"
    # A deleted session's variables are forgotten.
    await host.sessions.remove(s.id)
    assert host.runtime.services.environments.variables(s.id) == {}


async def test_output_beyond_the_memory_limit_spills_whole_to_a_managed_file(
    tmp_path: Path, repo: Path
) -> None:
    # The limit is lowered (to its floor, twice the tool-output bound) to keep this fast.
    config = RuntimeConfig(data_dir=tmp_path / "data", shell_output_memory_bytes=2)
    floor = 2 * config.tool_output_max_bytes + 2
    async with Embedded(config=config) as oc:
        s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        await oc.sessions.shell(s.id, ShellInput(command="seq 1 200000; echo the-end"))
        (ended,) = await until(oc, s.id, "session.shell.ended")
    expected = "".join(f"{i}\n" for i in range(1, 200_001)) + "the-end\n"
    assert len(expected) > 5 * floor  # well past what memory keeps
    output = ended["output"]
    # A bounded preview with the beginning and the end, pointing at the file...
    assert len(output.encode()) <= config.tool_output_max_bytes + 512
    assert output.startswith("1\n2\n3\n")
    assert output.rstrip().endswith("the-end")
    marker = output[output.index("full content saved to ") :]
    saved = Path(marker.removeprefix("full content saved to ").split(" ", 1)[0])
    # ...which holds every byte the command wrote, none lost.
    assert saved.parent == config.tool_output_dir
    assert await asyncio.to_thread(saved.read_text) == expected


async def test_ended_returns_once_every_shell_recorded_its_end(tmp_path: Path, repo: Path) -> None:
    async with Runtime(RuntimeConfig(data_dir=tmp_path / "data")) as rt:
        s = await rt.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        await rt.shells.ended()  # none running: at once
        first = await rt.shells.start(s, "echo one")
        second = await rt.shells.start(s, "echo two")
        await rt.shells.ended()
        assert rt.shells.running == 0
        pending = [i.id for i in await rt.sessions.pending(s.id)]
        assert sorted(pending) == sorted([notice_id(first), notice_id(second)])
