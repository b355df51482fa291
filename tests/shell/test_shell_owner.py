"""Every user shell has an owner and an end (issue 35, point 3).

A shell used to outlive the deletion of its session, ignore an interrupt,
and run as long as its command did: ``sleep 1e9`` lived until the server
restarted. Each test starts a command that would run for hours, waits for
its process group to be recorded, ends it one way, and waits (guarded) for
the group to be gone; the shell's entry says how it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from manual_clock import ManualClock

from actors.runtime import RuntimeConfig
from actors.tools._process import group_alive
from protocol.errors import InvalidRequestError, MessageNotFoundError
from protocol.operations import ShellInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location
from server.embedded import Embedded
from tests.shell.conftest import until

LONG = "sleep 100000; echo done > finished"


async def _gone(pgid: int) -> None:
    async with asyncio.timeout(30):  # a guard: the group is killed, not waited out
        while group_alive(pgid):  # noqa: ASYNC110 (a process group, not an event)
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _reaped() -> AsyncIterator[list[int]]:
    """Groups a test started: killed at the end whatever happened (old code leaked them)."""
    groups: list[int] = []
    try:
        yield groups
    finally:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


async def _start(oc: Embedded, repo: Path, shell_id: str, groups: list[int]) -> tuple[str, int]:
    s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await oc.sessions.shell(s.id, ShellInput(id=shell_id, command=LONG))
    (spawned,) = await until(oc, s.id, "session.shell.spawned")
    groups.append(spawned["pgid"])
    return s.id, spawned["pgid"]


async def _entry(oc: Embedded, sid: str) -> Any:
    (shell,) = [m for m in (await oc.sessions.messages(sid, None)).data if m.type == "shell"]
    return shell


async def test_deleting_a_session_ends_its_shells(host: Embedded, repo: Path) -> None:
    async with _reaped() as groups:
        sid, pgid = await _start(host, repo, "msg_deleted", groups)
        await host.sessions.remove(sid)
        await _gone(pgid)
        assert host.runtime.shells.running == 0
    assert not (repo / "finished").exists()


async def test_an_interrupt_ends_the_sessions_shells_and_says_so(
    host: Embedded, repo: Path
) -> None:
    async with _reaped() as groups:
        sid, pgid = await _start(host, repo, "msg_interrupted", groups)
        assert (await host.sessions.interrupt(sid)).interrupted is True
        (ended,) = await until(host, sid, "session.shell.ended")
        await _gone(pgid)
    assert ended["shell"]["state"] == "cancelled"
    assert ended["shell"]["reason"] == "interrupted"
    assert ended["output"].endswith("Command cancelled: the session was interrupted")
    entry = await _entry(host, sid)
    assert (entry.shell.state, entry.shell.reason) == ("cancelled", "interrupted")
    # Its notice waits for the agent, as for any other end.
    (item,) = await host.sessions.inbox(sid)
    assert item.payload["metadata"]["state"] == "cancelled"
    # Nothing left to interrupt: a second one is a no-op.
    assert (await host.sessions.interrupt(sid)).interrupted is False


async def test_a_shell_past_shell_timeout_s_is_ended(tmp_path: Path, repo: Path) -> None:
    """At ``shell_timeout_s`` on the runtime's clock, not a millisecond before."""
    clock = ManualClock()
    config = RuntimeConfig(
        data_dir=tmp_path / "data", shell_timeout_s=60, lease_ttl_ms=86_400_000, clock=clock
    )
    async with _reaped() as groups, Embedded(config=config) as oc:
        due = clock.now_ms() + 60_000
        sid, pgid = await _start(oc, repo, "msg_timedout", groups)
        await clock.until_waiting(due)
        clock.advance(59_999)
        assert due in clock.waits()  # not yet
        assert (await _entry(oc, sid)).shell.state == "running"  # the loop ran meanwhile
        assert group_alive(pgid)
        clock.advance(1)
        (ended,) = await until(oc, sid, "session.shell.ended")
        await _gone(pgid)
    assert ended["shell"]["state"] == "failed"
    assert ended["shell"]["reason"] == "timeout"
    assert "exit" not in ended["shell"]
    assert ended["output"].endswith("Command timed out after 60 s")


def test_the_default_shell_timeout_is_ten_minutes(tmp_path: Path) -> None:
    assert RuntimeConfig(data_dir=tmp_path).shell_timeout_s == 600


async def test_cancel_ends_one_shell_and_leaves_the_others(host: Embedded, repo: Path) -> None:
    async with _reaped() as groups:
        sid, pgid = await _start(host, repo, "msg_cancelme", groups)
        await host.sessions.shell(sid, ShellInput(id="msg_keepme", command=LONG))
        spawned = await until(host, sid, "session.shell.spawned", 2)
        other = spawned[1]["pgid"]
        groups.append(other)
        await host.sessions.shell_cancel(sid, "msg_cancelme")
        (ended,) = await until(host, sid, "session.shell.ended")
        await _gone(pgid)
        assert ended["shell"]["id"] == "msg_cancelme"
        assert (ended["shell"]["state"], ended["shell"]["reason"]) == ("cancelled", "cancelled")
        assert group_alive(other)
        # An ended shell stays as it ended.
        await host.sessions.shell_cancel(sid, "msg_cancelme")
        assert len(await until(host, sid, "session.shell.ended")) == 1


async def test_cancel_refuses_unknown_ids_and_another_sessions_shell(
    host: Embedded, repo: Path
) -> None:
    async with _reaped() as groups:
        sid, pgid = await _start(host, repo, "msg_theirs", groups)
        mine = await host.sessions.create(
            CreateSessionInput(location=Location(directory=str(repo)))
        )
        with pytest.raises(MessageNotFoundError):
            await host.sessions.shell_cancel(mine.id, "msg_theirs")
        with pytest.raises(MessageNotFoundError):
            await host.sessions.shell_cancel(sid, "msg_nosuchshell")
        with pytest.raises(InvalidRequestError):
            await host.sessions.shell_cancel(sid, "ses_notamessage")
        # Another session's shell, and the session's own prompt, are no shells of it.
        assert group_alive(pgid)
        await host.sessions.shell_cancel(sid, "msg_theirs")
        await _gone(pgid)


async def test_a_running_shell_does_not_hold_back_a_prompts_wakeup(
    host: Embedded, repo: Path
) -> None:
    async with _reaped() as groups:
        sid, pgid = await _start(host, repo, "msg_busyshell", groups)
        await host.sessions.prompt(sid, PromptInput(text="#text answered meanwhile"))
        await until(host, sid, "session.execution.succeeded")
        page = await host.sessions.messages(sid, None)
        [answer] = [m for m in page.data if m.type == "assistant"]
        assert answer.finish == "stop"  # type: ignore[union-attr]
        # The shell ran on through the whole turn, untouched.
        assert group_alive(pgid)
        assert host.runtime.shells.running == 1
        await host.sessions.shell_cancel(sid, "msg_busyshell")
        await _gone(pgid)


async def test_a_cancelled_caller_does_not_cancel_the_shells_recording(
    host: Embedded, repo: Path
) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    # The command waits for the test's go-ahead, so it ends after its caller is gone.
    command = "while [ ! -e go ]; do sleep 0.01; done; echo finished"
    caller = asyncio.create_task(
        host.sessions.shell(s.id, ShellInput(id="msg_orphaned", command=command))
    )

    def cancel_caller(message: dict[str, Any]) -> None:
        # Run as the start commits: the caller is still inside its call.
        if message["type"] == "session.shell.started":
            caller.cancel()

    unsubscribe = host.runtime.bus.subscribe(cancel_caller)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await caller
    finally:
        unsubscribe()
    assert caller.cancelled()
    (repo / "go").touch()
    (ended,) = await until(host, s.id, "session.shell.ended")
    assert (ended["shell"]["state"], ended["shell"]["exit"]) == ("completed", 0)
    assert ended["output"] == "finished\n"
    [notice] = await host.sessions.inbox(s.id)
    assert notice.payload["metadata"]["shellID"] == "msg_orphaned"
    # Closing the host does end a shell: test_shutdown_kills_shell_and_next_start_cancels_it_once.
