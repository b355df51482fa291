"""Agent configuration: built-ins, the data dir's file, the project's file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, Final

import pytest
from feed import Feed

from actors.agents import (
    DEFAULT_AGENT,
    AgentCatalog,
    AgentCatalogs,
    load_catalog,
    project_file,
)
from actors.llm import (
    Finish,
    ModelRequest,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
    ToolCall,
    ToolResultContent,
)
from actors.runtime import Runtime, RuntimeConfig
from actors.sessions import Sessions
from actors.tools import builtin_tools, permission
from protocol import InvalidRequestError, ModelRef
from protocol.requests import CreateSessionInput, PromptInput, UpdateSessionInput
from protocol.shapes import Location

BUILTIN_NAMES: Final = tuple(t.name for t in builtin_tools())


def test_builtins_without_files(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path / "missing.toml")
    assert catalog.get(None).name == DEFAULT_AGENT
    with pytest.raises(InvalidRequestError, match="unknown agent 'nobody'") as refused:
        catalog.get("nobody")  # never the default in its place
    assert refused.value.fields["field"] == "agent"
    assert catalog.get("build").steps is None  # absent means unlimited
    assert catalog.get("plan").permissions["bash"] == "deny"


def test_later_files_override_field_by_field(tmp_path: Path) -> None:
    data = tmp_path / "agents.toml"
    data.write_text(
        '[agents.build]\nsteps = 5\nsystem = "data"\n'
        '[agents.build.permissions]\nbash = "deny"\n'
        '[agents.extra]\nmodel = { id = "m", providerID = "p" }\n'
    )
    project = project_file(tmp_path / "proj")
    project.parent.mkdir(parents=True)
    project.write_text(
        '[agents.build]\nsystem = "project"\n[agents.build.permissions]\nread = "deny"\n'
    )
    catalog = load_catalog(data, project=project)
    build = catalog.get("build")
    assert (build.steps, build.system) == (5, "project")
    assert build.permissions == {"*": "allow", "bash": "deny", "read": "deny"}
    assert catalog.get("extra").model == ModelRef(id="m", provider_id="p")


@pytest.mark.parametrize(
    "text",
    [
        "[agents.build\n",
        "[agents.build]\nsteps = 0\n",
        '[agents.build]\nsteps = "many"\n',
        '[agents.build.permissions]\nbash = "maybe"\n',
        '[agents.build]\nmodel = { id = "m" }\n',
        "agents = 3\n",
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(text)
    with pytest.raises(InvalidRequestError, match=r"agents"):
        load_catalog(path)


class _CountingThread:
    """Runs each read on a real thread, counting them; ``gate`` holds them until set."""

    def __init__(self) -> None:
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self._read = asyncio.Event()

    async def __call__(self, fn: Callable[[], AgentCatalog]) -> AgentCatalog:
        self.reads += 1
        self._read.set()
        await self.gate.wait()
        return await asyncio.to_thread(fn)

    async def until_reads(self, count: int) -> None:
        """Return once ``count`` reads have begun (each then waits at the gate)."""
        async with asyncio.timeout(10):
            while self.reads < count:
                self._read.clear()
                await self._read.wait()


async def test_callers_of_an_expired_catalog_share_one_read(tmp_path: Path) -> None:
    data = tmp_path / "agents.toml"
    data.write_text('[agents.extra]\nsystem = "x"\n')
    thread = _CountingThread()
    catalogs = AgentCatalogs((data,), thread)
    thread.gate.clear()
    callers = [asyncio.ensure_future(catalogs.agent(str(tmp_path), "extra")) for _ in range(50)]
    # The first caller's read has begun; the other 49 took their first step in the
    # same turn of the loop, before this one resumes: each joined that read.
    await thread.until_reads(1)
    thread.gate.set()
    agents = await asyncio.gather(*callers)
    assert {a.system for a in agents} == {"x"}
    assert thread.reads == 1  # not one per caller


async def test_a_failed_or_cancelled_shared_read_leaves_each_waiter_its_own(
    tmp_path: Path,
) -> None:
    data = tmp_path / "agents.toml"
    data.write_text("[agents.build\n")  # unreadable: every read raises
    thread = _CountingThread()
    catalogs = AgentCatalogs((data,), thread)
    thread.gate.clear()
    callers = [asyncio.ensure_future(catalogs.load(str(tmp_path))) for _ in range(3)]
    await thread.until_reads(1)
    thread.gate.set()
    outcomes = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(o, InvalidRequestError) for o in outcomes)
    data.write_text('[agents.extra]\nsystem = "y"\n')
    # The reader is cancelled while its read waits: the waiter reads for itself.
    thread.gate.clear()
    reads = thread.reads
    first = asyncio.ensure_future(catalogs.load(str(tmp_path)))
    await thread.until_reads(reads + 1)
    second = asyncio.ensure_future(catalogs.agent(str(tmp_path), "extra"))
    await asyncio.sleep(0)  # one turn: ``second`` joins ``first``'s read
    assert thread.reads == reads + 1
    first.cancel()
    await thread.until_reads(reads + 2)  # ``second`` reads for itself
    thread.gate.set()
    assert (await second).system == "y"
    assert first.cancelled()


async def test_a_project_agent_script_drives_the_scripted_model(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    path = project_file(workdir)
    path.parent.mkdir()
    path.write_text("[agents.demo]\nscript = '''\n#text from the project script\n'''\n")
    s = await runtime.sessions.create(CreateSessionInput(agent="demo"))
    await runtime.sessions.prompt(s.id, PromptInput(text="hello"))
    ended = await feed.wait("session.text.ended", sessionID=s.id)
    assert ended["data"]["text"] == "from the project script"


async def test_a_session_metadata_script_wins(runtime: Runtime, feed: Feed) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.update(
        s.id, UpdateSessionInput(metadata={"script": "#text from session metadata"})
    )
    await runtime.sessions.prompt(s.id, PromptInput(text="hello"))
    ended = await feed.wait("session.text.ended", sessionID=s.id)
    assert ended["data"]["text"] == "from session metadata"


# -- unknown agent names ------------------------------------------------------------------------


async def test_an_unknown_agent_is_refused_at_creation_and_selection(runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="unknown agent 'plna'") as refused:
        await runtime.sessions.create(CreateSessionInput(agent="plna"))
    assert refused.value.fields["field"] == "agent"
    assert (await runtime.sessions.list()).data == ()  # nothing was created

    s = await runtime.sessions.create(CreateSessionInput(agent="plan"))
    with pytest.raises(InvalidRequestError, match="unknown agent 'plna'") as refused:
        await runtime.sessions.switch_agent(s.id, "plna")
    assert refused.value.fields["field"] == "agent"
    assert (await runtime.sessions.get(s.id)).agent == "plan"


async def test_the_known_agents_are_the_operators_and_the_sessions_directorys(
    tmp_path: Path, workdir: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_text('[agents.ops]\nsystem = "operator"\n')
    other = tmp_path / "other"
    other.mkdir()
    config = RuntimeConfig(data_dir=data, default_directory=str(workdir))
    async with Runtime(config) as rt:
        here = await rt.sessions.create(CreateSessionInput(agent="ops"))
        elsewhere = await rt.sessions.create(
            CreateSessionInput(agent="ops", location=Location(directory=str(other)))
        )
        # A project agent is known in its own directory only...
        with pytest.raises(InvalidRequestError, match="unknown agent 'reviewer'"):
            await rt.sessions.switch_agent(here.id, "reviewer")
        path = project_file(workdir)
        path.parent.mkdir()
        path.write_text('[agents.reviewer]\nsystem = "project"\n')
        # ...at once, though the catalog was read a moment ago.
        await rt.sessions.switch_agent(here.id, "reviewer")
        assert (await rt.sessions.get(here.id)).agent == "reviewer"
        with pytest.raises(InvalidRequestError, match="unknown agent 'reviewer'"):
            await rt.sessions.switch_agent(elsewhere.id, "reviewer")
        with pytest.raises(InvalidRequestError, match="unknown agent 'reviewer'"):
            await rt.sessions.create(
                CreateSessionInput(agent="reviewer", location=Location(directory=str(other)))
            )


async def test_a_recorded_unknown_agent_fails_the_execution_instead_of_running_as_build(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    # A session recorded with a name no catalog knows (created before names were
    # checked, or its agent since removed from agents.toml): nothing runs as build.
    unchecked = Sessions(runtime.store, default_directory=str(workdir))
    s = await unchecked.create(CreateSessionInput(agent="plna"))
    await runtime.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "touch ran"}'))
    failed = await feed.wait("session.execution.failed", sessionID=s.id)
    assert failed["data"]["error"]["type"] == "agent.unavailable"
    assert "unknown agent 'plna'" in failed["data"]["error"]["message"]
    assert "session.step.started" not in feed.types(s.id)
    assert not (workdir / "ran").exists()


# -- what plan may do, what is offered, what a denial does ---------------------------------------


def test_the_builtin_plan_agent_reads_but_cannot_write_edit_or_run_bash(tmp_path: Path) -> None:
    plan = load_catalog(tmp_path / "missing.toml").get("plan")
    decisions = {name: permission(plan.permissions, name) for name in BUILTIN_NAMES}
    assert decisions == {
        "bash": "deny",
        "read": "allow",
        "write": "deny",
        "edit": "deny",
        "list": "allow",
        "glob": "allow",
        "grep": "allow",
    }


async def test_plan_calls_to_write_edit_and_bash_fail_and_the_step_goes_on(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    (workdir / "notes.txt").write_text("original\n")
    s = await runtime.sessions.create(CreateSessionInput(agent="plan"))
    script = "\n".join(
        [
            '#tool write {"path": "new.txt", "content": "x"}',
            '#tool edit {"path": "notes.txt", "old_string": "original", "new_string": "changed"}',
            '#tool bash {"command": "touch ran"}',
            '#tool read {"path": "notes.txt"}',
            "#step",
            "#text carried on",
        ]
    )
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    assert not (workdir / "new.txt").exists()
    assert not (workdir / "ran").exists()
    assert (workdir / "notes.txt").read_text() == "original\n"
    failures = [e["data"]["error"] for e in feed.events if e["type"] == "session.tool.failed"]
    assert [f["type"] for f in failures] == ["permission.denied"] * 3
    assert {f["message"] for f in failures} == {
        f"Permission denied: agent plan may not use the {name} tool"
        for name in ("write", "edit", "bash")
    }
    assert [e["type"] for e in feed.events if e["type"] == "session.tool.success"] == [
        "session.tool.success"
    ]  # the read ran
    types = feed.types(s.id)
    assert "session.step.failed" not in types
    assert types.count("session.step.ended") == 2
    ended = [e for e in feed.events if e["type"] == "session.text.ended"]
    assert ended[-1]["data"]["text"] == "carried on"


class Recorder:
    """A provider that calls one tool in its first step and answers in the next."""

    def __init__(self, tool: str, tool_input: dict[str, Any]) -> None:
        self.tool, self.tool_input = tool, tool_input
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        self.requests.append(request)
        if len(self.requests) == 1:
            yield ToolCall(id="call_1", name=self.tool, input=self.tool_input)
            yield Finish(reason="tool-calls")
            return
        yield TextStart(ordinal=0)
        yield TextChunk(ordinal=0, delta="understood")
        yield TextEnd(ordinal=0)
        yield Finish(reason="stop")


async def _record(tmp_path: Path, workdir: Path, agent: str, recorder: Recorder) -> list[str]:
    """Run one prompt under ``agent`` with ``recorder`` as the model; the event types."""
    config = RuntimeConfig(
        data_dir=tmp_path / "data", default_directory=str(workdir), providers={"rec": recorder}
    )
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(
            CreateSessionInput(agent=agent, model=ModelRef(id="rec-1", provider_id="rec"))
        )
        await rt.sessions.prompt(s.id, PromptInput(text="go"))
        await feed.wait("session.execution.succeeded", sessionID=s.id)
        return feed.types(s.id)


async def test_only_the_tools_an_agent_may_use_are_offered(tmp_path: Path, workdir: Path) -> None:
    plan = Recorder("list", {"path": "."})
    await _record(tmp_path, workdir, "plan", plan)
    assert {t.name for t in plan.requests[0].tools} == {"read", "list", "glob", "grep"}
    build = Recorder("list", {"path": "."})
    await _record(tmp_path, workdir, "build", build)
    # Every built-in tool, and the task tool that hands work to a subagent.
    assert {t.name for t in build.requests[0].tools} == {*BUILTIN_NAMES, "task"}


async def test_a_denied_call_is_in_the_next_steps_history(tmp_path: Path, workdir: Path) -> None:
    # The model calls bash though it was not offered: that call fails, nothing runs,
    # and the next step's request carries the failure for the model to react to.
    recorder = Recorder("bash", {"command": "touch ran"})
    types = await _record(tmp_path, workdir, "plan", recorder)
    assert not (workdir / "ran").exists()
    assert "session.step.failed" not in types
    assert types.count("session.step.ended") == 2
    assert len(recorder.requests) == 2
    results = [
        part
        for message in recorder.requests[1].messages
        for part in message.parts
        if isinstance(part, ToolResultContent)
    ]
    assert [(r.id, r.name, r.is_error) for r in results] == [("call_1", "bash", True)]
    assert results[0].output == "Permission denied: agent plan may not use the bash tool"
