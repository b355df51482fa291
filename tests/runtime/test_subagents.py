"""Subagents: the task tool runs a child session to its terminal, through a real runtime.

The parent's model calls ``task`` by scripted directive, or over the real
OpenAI wire format from the local fake provider. Waits are on the feed
(an event committed), never on time; a long child is a scripted ``#delay``
that only an interrupt ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from feed import Feed
from llm.fake_providers import FakeProvider, Reply, openai_text, openai_tool_calls

from actors.llm import ModelLimits, ProviderConfig
from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import AssistantMessage, Location, ModelRef, ToolPart
from server.embedded import Embedded

#: A child that streams nothing until it is interrupted.
SLOW = "#delay 600000\n#text never"


def task(prompt: str, **more: Any) -> str:
    return "#tool task " + json.dumps({"description": "a sub-task", "prompt": prompt, **more})


def config(tmp_path: Path, workdir: Path, **kw: Any) -> RuntimeConfig:
    return RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir), **kw)


@pytest.fixture
async def rt(tmp_path: Path, workdir: Path) -> AsyncIterator[Runtime]:
    async with Runtime(config(tmp_path, workdir)) as runtime:
        yield runtime


@pytest.fixture
def feed(rt: Runtime) -> Feed:
    f = Feed()
    rt.bus.subscribe(f)
    return f


async def tool_parts(rt: Runtime, session_id: str) -> list[ToolPart]:
    page = await rt.sessions.messages(session_id, order="asc", limit=200)
    return [
        p
        for m in page.data
        if isinstance(m, AssistantMessage)
        for p in m.parts
        if isinstance(p, ToolPart)
    ]


async def last_text(rt: Runtime, session_id: str) -> str:
    page = await rt.sessions.messages(session_id, order="desc", limit=1)
    (message,) = page.data
    assert isinstance(message, AssistantMessage)
    return "".join(getattr(p, "text", "") for p in message.parts)


async def started_child(feed: Feed, parent: str) -> str:
    """The child the parent's task created, once its first step has started."""
    created = await feed.wait("session.created", parentID=parent)
    child = str(created["data"]["sessionID"])
    await feed.wait("session.step.started", sessionID=child)
    return child


async def test_the_childs_final_text_is_the_parents_tool_result(
    tmp_path: Path, workdir: Path
) -> None:
    async with Embedded(config=config(tmp_path, workdir)) as oc:
        parent = await oc.sessions.create()
        script = task("#tool list {}\n#step\n#text The answer is 42.") + "\n#step\n#text Done."
        await oc.sessions.prompt(parent.id, PromptInput(text=script))
        await oc.sessions.wait(parent.id)

        (call,) = await tool_parts(oc.runtime, parent.id)
        assert call.name == "task"
        assert call.status == "completed"
        assert call.content == ({"type": "text", "text": "The answer is 42."},)
        assert call.metadata is not None
        child_id = call.metadata["sessionID"]
        assert call.metadata["agent"] == "general"
        assert await last_text(oc.runtime, parent.id) == "Done."

        # GET /api/session/{id}/children, through the client.
        (child,) = await oc.sessions.children(parent.id)
        assert child.id == child_id
        assert child.parent_id == parent.id
        assert child.location == parent.location
        assert child.agent == "general"
        assert child.title == "a sub-task (@general subagent)"
        assert await oc.sessions.children(child.id) == ()

        # The child's log is its own: its steps are not in the parent's.
        parent_log = [e async for e in oc.sessions.log(parent.id)]
        child_log = [e async for e in oc.sessions.log(child.id)]
        assert all(e.data.get("data", {}).get("sessionID") in (None, parent.id) for e in parent_log)
        child_types = [e.event for e in child_log]
        assert child_types.count("session.step.started") == 2
        assert "session.execution.succeeded" in child_types


async def test_a_task_over_the_openai_wire_format(tmp_path: Path, workdir: Path) -> None:
    async with FakeProvider() as fake:
        provider = ProviderConfig(
            id="oa",
            kind="openai",
            base_url=fake.openai_url,
            models={"gpt-fake": ModelLimits(context=100_000, output=1000)},
        )
        model = ModelRef(provider_id="oa", id="gpt-fake")
        arguments = json.dumps({"description": "count files", "prompt": "How many files?"})
        fake.replies.extend(
            [
                Reply.stream(openai_tool_calls([("call_t", "task", [arguments])])),
                Reply.stream(openai_text(["There are ", "3 files."])),  # the child
                Reply.stream(openai_text(["The subagent says 3."])),
            ]
        )
        cfg = config(tmp_path, workdir, provider_configs={"oa": provider})
        async with Runtime(cfg) as rt:
            parent = await rt.sessions.create(CreateSessionInput(model=model))
            await rt.sessions.prompt(parent.id, PromptInput(text="count them", resume=False))
            assert (await rt.resume(parent.id)).kind == "succeeded"
            (call,) = await tool_parts(rt, parent.id)
            assert call.status == "completed"
            assert call.content == ({"type": "text", "text": "There are 3 files."},)
            (child,) = await rt.sessions.children(parent.id)
            assert child.model == model  # the caller's model: general names none
            assert await last_text(rt, parent.id) == "The subagent says 3."

        parent_first, child_request, parent_second = (r.body for r in fake.received)
        assert "task" in {t["function"]["name"] for t in parent_first["tools"]}
        assert child_request["messages"][-1] == {"role": "user", "content": "How many files?"}
        # The child's answer reaches the parent as the task call's result.
        (result,) = [m for m in parent_second["messages"] if m["role"] == "tool"]
        assert result["tool_call_id"] == "call_t"
        assert result["content"] == "There are 3 files."


async def test_interrupting_the_parent_interrupts_its_running_child(
    rt: Runtime, feed: Feed
) -> None:
    parent = await rt.sessions.create()
    await rt.sessions.prompt(parent.id, PromptInput(text=task(SLOW)))
    child = await started_child(feed, parent.id)
    # The child runs as a session of its own.
    assert {parent.id, child} <= set(await rt.execution.active())

    assert await rt.interrupt(parent.id)
    await feed.wait("session.execution.interrupted", sessionID=parent.id)
    await feed.wait("session.execution.interrupted", sessionID=child)
    assert await rt.execution.active() == []
    (call,) = await tool_parts(rt, parent.id)
    assert call.status == "error"
    assert call.error is not None
    assert call.error["type"] == "aborted"
    # The child stopped before the parent's call settled.
    types = [(m["type"], m["data"]["sessionID"]) for m in feed.events if m.get("durable")]
    assert types.index(("session.execution.interrupted", child)) < types.index(
        ("session.tool.failed", parent.id)
    )
    assert await rt.store.queries.claims() == []


async def test_deleting_the_parent_deletes_its_running_child(rt: Runtime, feed: Feed) -> None:
    parent = await rt.sessions.create()
    await rt.sessions.prompt(parent.id, PromptInput(text=task(SLOW)))
    child = await started_child(feed, parent.id)

    await rt.sessions.remove(parent.id)
    assert await rt.store.queries.session(child) is None
    assert await rt.store.queries.session(parent.id) is None
    assert await rt.execution.active() == []


async def test_a_child_that_fails_fails_the_call_with_its_id(rt: Runtime, feed: Feed) -> None:
    parent = await rt.sessions.create()
    script = task("#fail auth") + "\n#step\n#text Noted."
    await rt.sessions.prompt(parent.id, PromptInput(text=script))
    await feed.wait("session.execution.succeeded", sessionID=parent.id)
    (call,) = await tool_parts(rt, parent.id)
    assert call.status == "error"
    assert call.error is not None
    assert call.error["type"] == "task.failed"
    (child,) = await rt.sessions.children(parent.id)
    assert call.metadata == {"sessionID": child.id, "agent": "general"}
    assert child.id in call.error["message"]


async def test_only_subagents_may_be_named(rt: Runtime, feed: Feed) -> None:
    parent = await rt.sessions.create()
    script = task("#text hi", agent="build") + "\n#step\n#text Noted."
    await rt.sessions.prompt(parent.id, PromptInput(text=script))
    await feed.wait("session.execution.succeeded", sessionID=parent.id)
    (call,) = await tool_parts(rt, parent.id)
    assert call.error is not None
    assert call.error["type"] == "invalid-input"
    assert "subagents here: general" in call.error["message"]
    assert await rt.sessions.children(parent.id) == []


async def test_depth_and_concurrent_children_are_bounded(tmp_path: Path, workdir: Path) -> None:
    async with Runtime(
        config(tmp_path, workdir, subagent_max_depth=1, subagent_max_children=1)
    ) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        # A child may not start a grandchild past the depth.
        parent = await rt.sessions.create()
        inner = task("#text deeper") + "\n#step\n#text Child done."
        await rt.sessions.prompt(parent.id, PromptInput(text=task(inner) + "\n#step\n#text Ok."))
        await feed.wait("session.execution.succeeded", sessionID=parent.id)
        (child,) = await rt.sessions.children(parent.id)
        (nested,) = await tool_parts(rt, child.id)
        assert nested.error is not None
        assert nested.error["type"] == "task.limit"
        assert await rt.sessions.children(child.id) == []

        # Two tasks in one step, one child at a time: the second is refused at once.
        other = await rt.sessions.create()
        both = task("#text one") + "\n" + task("#text two") + "\n#step\n#text Ok."
        await rt.sessions.prompt(other.id, PromptInput(text=both))
        await feed.wait("session.execution.succeeded", sessionID=other.id)
        statuses = sorted(p.status for p in await tool_parts(rt, other.id))
        assert statuses == ["completed", "error"]
        assert len(await rt.sessions.children(other.id)) == 1


async def test_a_child_in_another_location_is_not_possible(
    rt: Runtime, feed: Feed, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    parent = await rt.sessions.create(
        CreateSessionInput(location=Location(directory=str(elsewhere)))
    )
    await rt.sessions.prompt(parent.id, PromptInput(text=task("#text hi") + "\n#step\n#text Ok."))
    await feed.wait("session.execution.succeeded", sessionID=parent.id)
    (child,) = await rt.sessions.children(parent.id)
    assert child.location.directory == str(elsewhere)


async def test_a_running_child_does_not_make_its_parent_active(rt: Runtime, feed: Feed) -> None:
    parent = await rt.sessions.create()
    await rt.sessions.prompt(
        parent.id, PromptInput(text=task("#text first") + "\n#step\n#text Ok.")
    )
    await feed.wait("session.execution.succeeded", sessionID=parent.id)
    (child,) = await rt.sessions.children(parent.id)
    # The child, prompted on its own, runs while its parent is idle.
    mark = len(feed.events)
    await rt.sessions.prompt(child.id, PromptInput(text=SLOW))
    await feed.wait("session.step.started", after=mark, sessionID=child.id)
    assert await rt.execution.active() == [child.id]
    assert set(await rt.active()) == {child.id}
    assert await rt.interrupt(parent.id)  # and the parent's interrupt reaches it
    await feed.wait("session.execution.interrupted", sessionID=child.id)
    assert await rt.execution.active() == []


async def test_a_shutdown_mid_child_keeps_both_claims_and_the_restart_settles_them(
    tmp_path: Path, workdir: Path
) -> None:
    async with Runtime(config(tmp_path, workdir)) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        parent = await rt.sessions.create()
        await rt.sessions.prompt(parent.id, PromptInput(text=task(SLOW)))
        child = await started_child(feed, parent.id)
    # Closed: the child was interrupted as a shutdown, like its parent; claims kept.
    interrupted = {
        m["data"]["sessionID"]: m["data"]["reason"]
        for m in feed.events
        if m["type"] == "session.execution.interrupted"
    }
    assert interrupted == {parent.id: "shutdown", child: "shutdown"}

    async with Runtime(config(tmp_path, workdir)) as rt:
        assert rt.recovery.resumed == (parent.id,)
        assert rt.recovery.orphans_released == (child,)
        await rt.wait_idle(parent.id)
        (call,) = await tool_parts(rt, parent.id)
        assert call.error is not None
        assert call.error["type"] == "aborted"
        assert await rt.store.queries.claims() == []
        assert await rt.execution.active() == []
