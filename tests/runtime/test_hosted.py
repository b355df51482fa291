"""Hosted (provider-executed) calls through the runtime: durable, settled, never run locally.

The real Anthropic wire format comes from the local fake provider server; the
scripted model's ``#hosted`` directive drives the same path without one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from feed import Feed
from llm.fake_providers import (
    WEB_SEARCH_RESULT,
    FakeProvider,
    Reply,
    anthropic_hosted,
    anthropic_text,
)
from pgdb import stored_and_rebuilt

from actors.llm import ModelLimits, ProviderConfig
from actors.runtime import Runtime, RuntimeConfig
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import AssistantMessage, ModelRef, ToolPart
from storage import Command

ANTHROPIC = ModelRef(provider_id="an", id="claude-fake")


@pytest.fixture
async def world(tmp_path: Path, workdir: Path) -> AsyncIterator[tuple[Runtime, FakeProvider, Feed]]:
    async with FakeProvider() as fake:
        provider = ProviderConfig(
            id="an",
            kind="anthropic",
            base_url=fake.anthropic_url,
            models={"claude-fake": ModelLimits(context=100_000, output=1000)},
        )
        config = RuntimeConfig(
            data_dir=tmp_path / "data",
            default_directory=str(workdir),
            provider_configs={"an": provider},
            retry_base_delay_s=0.001,
        )
        async with Runtime(config) as rt:
            feed = Feed()
            rt.bus.subscribe(feed)
            yield rt, fake, feed


async def run(rt: Runtime, session_id: str, text: str) -> Any:
    await rt.sessions.prompt(session_id, PromptInput(text=text, resume=False))
    return await rt.execution.resume(session_id)


def durable(feed: Feed, session_id: str) -> list[dict[str, Any]]:
    return [m for m in feed.events if m.get("durable") and m["data"].get("sessionID") == session_id]


async def tool_parts(rt: Runtime, session_id: str) -> list[ToolPart]:
    page = await rt.sessions.messages(session_id, order="asc", limit=200)
    return [
        p
        for m in page.data
        if isinstance(m, AssistantMessage)
        for p in m.parts
        if isinstance(p, ToolPart)
    ]


async def replay_matches(rt: Runtime) -> None:
    stored, rebuilt = await stored_and_rebuilt(rt.store)
    assert stored == rebuilt


async def test_a_hosted_call_with_its_result_succeeds_and_replays_natively(
    world: tuple[Runtime, FakeProvider, Feed],
) -> None:
    rt, fake, feed = world
    sid = (await rt.sessions.create(CreateSessionInput(model=ANTHROPIC))).id
    fake.replies.append(Reply.stream(anthropic_hosted()))
    terminal = await run(rt, sid, "search the web")
    assert terminal.kind == "succeeded"

    events = durable(feed, sid)
    types = [m["type"] for m in events]
    (called,) = [m["data"] for m in events if m["type"] == "session.tool.called"]
    assert called["id"] == "srvtoolu_1"
    assert called["name"] == "web_search"
    assert called["input"] == {"query": "sessionrt"}
    assert called["providerExecuted"] is True
    (success,) = [m["data"] for m in events if m["type"] == "session.tool.success"]
    assert success["metadata"]["providerExecuted"] is True
    assert success["metadata"]["result"] == WEB_SEARCH_RESULT
    assert "https://example.com/a" in success["content"][0]["text"]
    assert "session.tool.failed" not in types
    assert (
        types.index("session.tool.called")
        < types.index("session.tool.success")
        < types.index("session.step.ended")
    )
    # A hosted call alone never makes the step continue: one model request.
    assert len(fake.received) == 1
    assert types.count("session.step.started") == 1

    (part,) = await tool_parts(rt, sid)
    assert part.status == "completed"
    await replay_matches(rt)

    # The next request gives the same model the provider's own blocks back.
    fake.replies.append(Reply.stream(anthropic_text(["again"])))
    assert (await run(rt, sid, "and now?")).kind == "succeeded"
    assistant = fake.received[-1].body["messages"][1]
    assert assistant["role"] == "assistant"
    kinds = [block["type"] for block in assistant["content"]]
    assert kinds == ["text", "server_tool_use", "web_search_tool_result", "text"]
    assert assistant["content"][1] == {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "web_search",
        "input": {"query": "sessionrt"},
    }
    assert assistant["content"][2] == WEB_SEARCH_RESULT
    # No tool_result for a hosted call: it is no local tool's.
    user = fake.received[-1].body["messages"][2]
    assert all(block["type"] != "tool_result" for block in user["content"])


async def test_a_hosted_call_without_result_fails_before_the_step_ends(
    world: tuple[Runtime, FakeProvider, Feed],
) -> None:
    rt, fake, feed = world
    sid = (await rt.sessions.create(CreateSessionInput(model=ANTHROPIC))).id
    fake.replies.append(Reply.stream(anthropic_hosted(None)))
    assert (await run(rt, sid, "search the web")).kind == "succeeded"

    events = durable(feed, sid)
    types = [m["type"] for m in events]
    (failed,) = [m["data"] for m in events if m["type"] == "session.tool.failed"]
    assert failed["id"] == "srvtoolu_1"
    assert failed["error"]["type"] == "tool.result-missing"
    assert failed["metadata"] == {"providerExecuted": True}
    assert types.index("session.tool.failed") < types.index("session.step.ended")
    assert len(fake.received) == 1
    (part,) = await tool_parts(rt, sid)
    assert part.status == "error"
    assert await rt.store.queries.open_tool_calls(sid) == []
    await replay_matches(rt)

    # Unanswered, it cannot go back natively (the API would refuse it): text.
    fake.replies.append(Reply.stream(anthropic_text(["ok"])))
    assert (await run(rt, sid, "again")).kind == "succeeded"
    assistant = fake.received[-1].body["messages"][1]["content"]
    assert [b["type"] for b in assistant] == ["text", "text", "text"]
    assert "web_search" in assistant[1]["text"]
    assert "no result" in assistant[1]["text"]


async def test_the_scripted_hosted_directive_is_recorded_never_run(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    sid = (await runtime.sessions.create(CreateSessionInput())).id
    # Named like a local tool on purpose: a hosted call must never reach it.
    script = (
        '#hosted bash {"command": "touch ran-locally"}\n'
        '#hosted-result {"type": "bash_tool_result", "content": "done remotely"}\n'
        "#hosted web_search {}\n"
        "#text Done."
    )
    assert (await run(runtime, sid, script)).kind == "succeeded"
    assert not (workdir / "ran-locally").exists()

    events = durable(feed, sid)
    types = [m["type"] for m in events]
    called = [m["data"] for m in events if m["type"] == "session.tool.called"]
    assert [c["providerExecuted"] for c in called] == [True, True]
    (success,) = [m["data"] for m in events if m["type"] == "session.tool.success"]
    assert success["content"] == [{"type": "text", "text": "done remotely"}]
    (failed,) = [m["data"] for m in events if m["type"] == "session.tool.failed"]
    assert failed["error"]["type"] == "tool.result-missing"
    assert failed["id"] == called[1]["id"]
    assert types.index("session.tool.failed") < types.index("session.step.ended")
    # Hosted calls only: the step finished with "stop" and did not continue.
    assert types.count("session.step.started") == 1
    parts = await tool_parts(runtime, sid)
    assert [p.status for p in parts] == ["completed", "error"]
    await replay_matches(runtime)


async def test_a_hosted_error_result_fails_the_call(runtime: Runtime, feed: Feed) -> None:
    sid = (await runtime.sessions.create(CreateSessionInput())).id
    script = (
        "#hosted web_search {}\n"
        '#hosted-result error {"content": {"type": "web_search_tool_result_error",'
        ' "error_code": "max_uses_exceeded"}}\n'
        "#text Could not search."
    )
    assert (await run(runtime, sid, script)).kind == "succeeded"
    (failed,) = [m["data"] for m in durable(feed, sid) if m["type"] == "session.tool.failed"]
    assert failed["error"]["type"] == "tool.error"
    assert "max_uses_exceeded" in failed["error"]["message"]
    assert failed["metadata"]["providerExecuted"] is True


async def test_a_hosted_call_a_crash_cut_off_still_reads_as_hosted(
    runtime: Runtime, feed: Feed
) -> None:
    """Recovery fails an open call without metadata; the call stays provider-executed."""
    sid = (await runtime.sessions.create(CreateSessionInput())).id
    msg = "msg_hostedcrash1"
    await runtime.store.append(
        Command.of(
            ev.StepStarted(
                session_id=sid,
                assistant_message_id=msg,
                agent="build",
                model=ModelRef(id="m", provider_id="scripted"),
                started=1,
            ),
            ev.ToolCalled(
                session_id=sid,
                assistant_message_id=msg,
                id="srvtoolu_1",
                name="web_search",
                input={"query": "q"},
                provider_executed=True,
            ),
        )
    )
    assert await runtime.services.drain.fail_stale_tools(sid) == 1
    (part,) = await tool_parts(runtime, sid)
    assert part.status == "error"
    assert part.error is not None
    assert part.error["type"] == "aborted"
    assert part.metadata == {"providerExecuted": True}
    await replay_matches(runtime)


async def test_a_failed_stream_settles_its_hosted_call_before_the_step_fails(
    runtime: Runtime, feed: Feed
) -> None:
    sid = (await runtime.sessions.create(CreateSessionInput())).id
    script = "#hosted web_search {}\n#fail auth after-output"
    assert (await run(runtime, sid, script)).kind == "failed"
    events = durable(feed, sid)
    types = [m["type"] for m in events]
    (failed,) = [m["data"] for m in events if m["type"] == "session.tool.failed"]
    assert failed["error"]["type"] == "aborted"
    assert failed["metadata"] == {"providerExecuted": True}
    assert types.index("session.tool.failed") < types.index("session.step.failed")
    assert await runtime.store.queries.open_tool_calls(sid) == []
    await replay_matches(runtime)
