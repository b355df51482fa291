"""Every process a tool starts has an owner: the call, then the next start.

Real runtime, real bash, real process groups. A command announces the pid of a
grandchild it started in the background (``sh -c 'sleep 30 & echo $!; ...'``),
so the test knows a member besides the leader exists before it acts.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from proc_groups import Spawn, alive, own_groups

from actors.runtime import Runtime, RuntimeConfig
from actors.tools import ProcessGroup
from actors.tools._process import group_alive, identify
from protocol import ModelRef
from protocol import events as ev
from protocol.events import EventEnvelope
from protocol.requests import CreateSessionInput, PromptInput
from storage import Command

GUARD = 20.0
#: A grandchild in the background, its pid on stdout, and a child in the foreground.
FAMILY = "sh -c 'sleep 30 & echo grandchild $!; sleep 30'"


def tool_prompt(command: str) -> PromptInput:
    return PromptInput(text="#tool bash " + json.dumps({"command": command, "timeout_s": 60}))


def expect(rt: Runtime, predicate: Callable[[EventEnvelope], bool]) -> Awaitable[EventEnvelope]:
    """Subscribes now; the result waits (guarded) for the first message that matches."""
    future: asyncio.Future[EventEnvelope] = asyncio.get_running_loop().create_future()

    def on(message: EventEnvelope) -> None:
        if not future.done() and predicate(message):
            future.set_result(message)

    unsubscribe = rt.bus.subscribe(on)

    async def wait() -> EventEnvelope:
        try:
            async with asyncio.timeout(GUARD):
                return await future
        finally:
            unsubscribe()

    return wait()


async def running_family(rt: Runtime, session_id: str) -> tuple[int, int]:
    """Start FAMILY in the session; (its process group, the grandchild's pid)."""
    spawned = expect(rt, lambda m: m["type"] == "session.tool.spawned" and _of(m, session_id))
    grandchild = expect(
        rt,
        lambda m: (
            m["type"] == "session.tool.progress"
            and _of(m, session_id)
            and "grandchild" in m["data"]["metadata"]["output"]
        ),
    )
    await rt.sessions.prompt(session_id, tool_prompt(FAMILY))
    pgid = (await spawned)["data"]["pgid"]
    output = (await grandchild)["data"]["metadata"]["output"]
    return pgid, int(output.split()[1])


def _of(message: EventEnvelope, session_id: str) -> bool:
    return bool(message["data"].get("sessionID") == session_id)


async def test_an_interrupt_kills_the_whole_group_grandchildren_too(runtime: Runtime) -> None:
    s = await runtime.sessions.create()
    pgid, grandchild = await running_family(runtime, s.id)
    assert await runtime.interrupt(s.id)
    await runtime.execution.wait_idle(s.id)
    assert not group_alive(pgid)
    assert not alive(grandchild)
    assert await runtime.store.queries.tool_processes() == []  # the terminal ended the record
    types = [r.type for r in await runtime.store.read(s.id, limit=1000)]
    assert types.index("session.tool.called.1") < types.index("session.tool.spawned.1")
    assert types.index("session.tool.spawned.1") < types.index("session.tool.failed.2")


async def test_deleting_a_session_mid_tool_kills_its_group_and_it_leaves_active(
    runtime: Runtime,
) -> None:
    s = await runtime.sessions.create()
    pgid, grandchild = await running_family(runtime, s.id)
    assert s.id in await runtime.execution.active()
    await runtime.sessions.remove(s.id)
    # Interrupted (tools killed) before the delete: nothing of it runs on.
    assert not group_alive(pgid)
    assert not alive(grandchild)
    assert s.id not in await runtime.execution.active()
    assert await runtime.store.queries.session(s.id) is None


@pytest.fixture
def strangers(tmp_path: Path) -> Iterator[Spawn]:
    """Process groups started by the test (as a dead server's tool would have been)."""
    with own_groups(tmp_path) as start:
        yield start


async def left_running(rt: Runtime, session_id: str, calls: dict[str, ProcessGroup]) -> None:
    """What a server killed mid-tool leaves: a claim, running calls, their records."""
    events: list[ev.Event] = [
        ev.ExecutionStarted(session_id=session_id),
        ev.StepStarted(
            session_id=session_id,
            assistant_message_id="msg_dead",
            agent="build",
            model=ModelRef(id="scripted", provider_id="scripted"),
            started=1,
        ),
    ]
    for call_id, group in calls.items():
        events += [
            ev.ToolCalled(
                session_id=session_id,
                assistant_message_id="msg_dead",
                id=call_id,
                name="bash",
                input={"command": "..."},
            ),
            ev.ToolSpawned(
                session_id=session_id,
                assistant_message_id="msg_dead",
                id=call_id,
                pgid=group.pgid,
                start_ticks=group.start_ticks,
                boot_id=group.boot_id,
            ),
        ]
    for event in events:
        await rt.store.append(Command.of(event))


async def test_the_startup_sweep_kills_a_stale_group_before_failing_its_call(
    tmp_path: Path, strangers: Any
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    marker = tmp_path / "marker"
    ours = strangers(f"sleep 30 & echo $!; sleep 30; touch {marker}")
    grandchild = int(ours.stdout.readline())
    # pid reuse: the recorded number is held by a process that is not the one recorded.
    reused = strangers("exec sleep 30")
    ours_group, reused_group = identify(ours.pid), identify(reused.pid)
    assert ours_group is not None
    assert reused_group is not None
    wrong_start = ProcessGroup(
        pgid=reused_group.pgid,
        start_ticks=reused_group.start_ticks - 1,
        boot_id=reused_group.boot_id,
    )
    async with Runtime(attrs.evolve(config, recover=False)) as rt:
        s = await rt.sessions.create(CreateSessionInput())
        await left_running(rt, s.id, {"call_ours": ours_group, "call_reused": wrong_start})
    async with Runtime(config) as rt:
        assert sorted(rt.recovery.stale_tools) == ["call_ours", "call_reused"]
        assert not group_alive(ours.pid)
        assert not alive(grandchild)
        assert reused.poll() is None  # a stranger's process is never signalled
        assert group_alive(reused.pid)
        failed = {
            r.event.id: r.event.error  # type: ignore[attr-defined]
            for r in await rt.store.read(s.id, limit=1000)
            if r.type == "session.tool.failed.2"
        }
        assert {k: v.type for k, v in failed.items()} == {
            "call_ours": "aborted",
            "call_reused": "aborted",
        }
        assert await rt.store.queries.tool_processes() == []
        await rt.execution.wait_idle(s.id)
    assert ours.wait() == -signal.SIGTERM
    assert not marker.exists()
