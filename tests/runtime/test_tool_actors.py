"""A step owns its tool calls' child actors: killing the owner ends the child and settles the call.

Real runtime, scripted model, real bash: the command writes its shell's pid
and sleeps. Mid-call the owner dies (the session's execution is interrupted,
which cancels the step; or the whole runtime is shut down). Afterwards no
call is left running (its call actor is idle, back in the pool), the command's
process is gone, and the call has its one durable terminal before the step's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import attrs
import pykka
from proc_groups import alive

from actors.runtime import Runtime, RuntimeConfig
from actors.tools import ToolCallActor
from protocol import events as ev
from protocol.events import EventEnvelope
from protocol.requests import PromptInput
from server.config import load_config, runtime_config

GUARD = 20.0
SLEEPER = "echo $$ > leader.pid; echo up; sleep 30"


def prompt(command: str) -> PromptInput:
    return PromptInput(text="#tool bash " + json.dumps({"command": command, "timeout_s": 60}))


async def started(rt: Runtime, session_id: str) -> None:
    """Prompt the sleeper and return once its child actor streams output."""
    up: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on(message: EventEnvelope) -> None:
        data = message["data"]
        if (
            message["type"] == "session.tool.progress"
            and data.get("sessionID") == session_id
            and "up" in data["metadata"]["output"]
            and not up.done()
        ):
            up.set_result(None)

    unsubscribe = rt.bus.subscribe(on)
    try:
        await rt.sessions.prompt(session_id, prompt(SLEEPER))
        async with asyncio.timeout(GUARD):
            await up
    finally:
        unsubscribe()


async def terminals(rt: Runtime, session_id: str) -> list[str]:
    return [r.type for r in await rt.store.read(session_id, limit=1000)]


async def test_interrupting_the_step_ends_its_child_and_settles_the_call(
    runtime: Runtime, workdir: Path
) -> None:
    s = await runtime.sessions.create()
    await started(runtime, s.id)
    [child] = pykka.ActorRegistry.get_by_class(ToolCallActor)
    leader = int((workdir / "leader.pid").read_text())
    assert alive(leader)
    assert await runtime.interrupt(s.id)
    await runtime.execution.wait_idle(s.id)
    # The owner waited for its call: none running, no process left; the actor is idle.
    assert runtime.services.tool_actors.running == 0
    assert pykka.ActorRegistry.get_by_class(ToolCallActor) == [child]
    assert not alive(leader)
    types = await terminals(runtime, s.id)
    assert types.count("session.tool.failed.2") == 1
    assert types.index("session.tool.failed.2") < types.index("session.step.failed.1")


async def test_shutting_the_runtime_down_mid_call_leaves_no_orphan(
    tmp_path: Path, workdir: Path, loop_hygiene: None
) -> None:
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Runtime(config) as rt:
        s = await rt.sessions.create()
        await started(rt, s.id)
        leader = int((workdir / "leader.pid").read_text())
        assert len(pykka.ActorRegistry.get_by_class(ToolCallActor)) == 1
    # The runtime is closed: its steps stopped their children before the pool closed.
    assert pykka.ActorRegistry.get_all() == []
    assert not alive(leader)
    async with Runtime(attrs.evolve(config, recover=False)) as rt:
        types = await terminals(rt, s.id)
    assert types.count("session.tool.failed.2") == 1
    assert types.index("session.tool.failed.2") < types.index("session.step.failed.1")


CONFIG = """
[runtime]
max_tool_threads = 3
max_blocking_threads = 2
bash_timeout_s = 1
bash_max_timeout_s = 1.5
bash_output_memory_bytes = 2097152
"""


async def test_the_runtime_keys_reach_the_pools_and_bash(
    tmp_path: Path, workdir: Path, loop_hygiene: None
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    config = runtime_config(load_config(path), None, fallback_data_dir=tmp_path / "data")
    config = attrs.evolve(config, default_directory=str(workdir))
    async with Runtime(config) as rt:
        assert rt.services.tool_actors.limit == 3
        assert rt.blocking.limit == 2
        s = await rt.sessions.create()
        # No timeout named: the configured default (1 s) ends it.
        await rt.sessions.prompt(
            s.id, PromptInput(text="#tool bash " + json.dumps({"command": "sleep 30"}))
        )
        await rt.execution.wait_idle(s.id)
        # Asking for a minute: clamped to the 1.5 s cap.
        await rt.sessions.prompt(s.id, prompt("sleep 30"))
        await rt.execution.wait_idle(s.id)
        failed = [
            r for r in await rt.store.read(s.id, limit=1000) if r.type == "session.tool.failed.2"
        ]
    errors = [r.event.error for r in failed if isinstance(r.event, ev.ToolFailed)]
    assert [e.type for e in errors] == ["timeout", "timeout"]
    assert errors[0].message.startswith("Command timed out after 1 s:")
    assert errors[1].message.startswith("Command timed out after 1.5 s:")
