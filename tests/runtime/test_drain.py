"""End to end through the runtime: admission, execution, steps, tools, claims."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from feed import Feed

from actors.runtime import Runtime
from protocol import AssistantMessage, UserMessage
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import TextPart, ToolPart


async def messages(rt: Runtime, session_id: str) -> list[object]:
    return list((await rt.sessions.messages(session_id, order="asc", limit=200)).data)


async def test_a_prompt_runs_to_a_scripted_reply(runtime: Runtime, feed: Feed) -> None:
    s = await runtime.sessions.create()
    receipt = await runtime.sessions.prompt(s.id, PromptInput(text="Inspect the failing tests"))
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    assert feed.types(s.id) == [
        "session.created",
        "session.inbox.enqueued",
        "session.execution.started",
        "session.instructions.updated",  # the baseline, before the input it follows
        "session.inbox.delivered",
        "session.step.started",
        "session.text.started",
        "session.text.ended",
        "session.step.ended",
        "session.execution.succeeded",
    ]
    user, reply = await messages(runtime, s.id)
    assert isinstance(user, UserMessage)
    assert user.id == receipt.id
    assert isinstance(reply, AssistantMessage)
    assert reply.parts == (TextPart(ordinal=0, text="Scripted reply: Inspect the failing tests"),)
    assert reply.finish == "stop"
    # Deltas went out live, and only live.
    deltas = [m for m in feed.events if m["type"] == "session.text.delta"]
    assert deltas
    assert all("durable" not in m for m in deltas)
    assert "".join(m["data"]["delta"] for m in deltas) == reply.parts[0].text  # type: ignore[union-attr]
    assert await runtime.execution.active() == []
    claims = await runtime.store.queries.claims()
    assert claims == []


async def test_a_tool_loop_continues_from_projected_history(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    s = await runtime.sessions.create()
    script = "\n".join(
        [
            "#text Writing the file.",
            '#tool write {"path": "notes.txt", "content": "hello from a tool"}',
            "#step",
            '#tool read {"path": "notes.txt"}',
            "#step",
            "#text All done.",
        ]
    )
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    assert (workdir / "notes.txt").read_text() == "hello from a tool"
    history = await messages(runtime, s.id)
    assistants = [m for m in history if isinstance(m, AssistantMessage)]
    assert [a.finish for a in assistants] == ["tool-calls", "tool-calls", "stop"]
    read_part = assistants[1].parts[0]
    assert isinstance(read_part, ToolPart)
    assert read_part.status == "completed"
    assert "hello from a tool" in read_part.content[0]["text"]  # type: ignore[index]
    types = feed.types(s.id)
    # The call is durable before its terminal; each step has one terminal.
    assert types.count("session.tool.called") == 2
    assert types.count("session.tool.success") == 2
    assert types.count("session.step.ended") == 3
    assert types.count("session.execution.started") == 1


async def test_a_steer_lands_at_the_next_step_boundary_and_a_queue_waits_for_idle(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    s = await runtime.sessions.create()
    gate = workdir / "gate"
    script = "\n".join(
        [
            f'#tool bash {{"command": "while [ ! -f {gate} ]; do sleep 0.01; done; echo open"}}',
            "#step",
            "#text First turn done.",
        ]
    )
    first = await runtime.sessions.prompt(s.id, PromptInput(text=script))
    await feed.wait("session.tool.called", sessionID=s.id)
    queued = await runtime.sessions.prompt(
        s.id, PromptInput(text="queued question", delivery="queue")
    )
    steer = await runtime.sessions.prompt(s.id, PromptInput(text="steer now"))
    gate.touch()  # let the tool finish only once both are admitted
    await feed.wait("session.execution.succeeded", sessionID=s.id)

    history = await messages(runtime, s.id)
    order = [m.id if isinstance(m, UserMessage) else "assistant" for m in history]  # type: ignore[attr-defined]
    assert order == [first.id, "assistant", steer.id, "assistant", queued.id, "assistant"]
    replies = [m for m in history if isinstance(m, AssistantMessage)]
    assert replies[1].parts == (TextPart(ordinal=0, text="Scripted reply: steer now"),)
    assert replies[2].parts == (TextPart(ordinal=0, text="Scripted reply: queued question"),)
    # One busy period carried all three turns.
    assert feed.types(s.id).count("session.execution.started") == 1


async def test_interrupt_stops_the_step_and_keeps_pending_input(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    s = await runtime.sessions.create()
    script = '#tool bash {"command": "echo started; sleep 30"}'
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    await feed.wait("session.tool.called", sessionID=s.id)
    later = await runtime.sessions.prompt(
        s.id, PromptInput(text="after the interrupt", delivery="queue")
    )
    await feed.wait("session.tool.progress", sessionID=s.id)  # the shell is running
    assert await runtime.interrupt(s.id) is True
    terminal = await feed.wait("session.execution.interrupted", sessionID=s.id)
    assert terminal["data"]["reason"] == "user"
    failed = await feed.wait("session.tool.failed", sessionID=s.id)
    assert failed["data"]["error"]["type"] == "aborted"
    types = feed.types(s.id)
    assert types.index("session.tool.failed") < types.index("session.step.failed")
    assert types.index("session.step.failed") < types.index("session.execution.interrupted")
    assert [i.id for i in await runtime.sessions.pending(s.id)] == [later.id]
    assert await runtime.store.queries.claims() == []  # a user interrupt releases the claim
    assert await runtime.interrupt(s.id) is False  # idle now: a no-op


async def test_tools_start_eagerly_and_settle_before_the_step_ends(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    s = await runtime.sessions.create()
    gate = workdir / "gate"
    wait = f"while [ ! -f {gate} ]; do sleep 0.01; done"
    script = "\n".join(
        [f'#tool bash {{"command": "{wait}; echo {n}"}}' for n in range(3)] + ["#step", "#text ok"]
    )
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    for n in range(3):
        await feed.wait("session.tool.called", sessionID=s.id, id=f"call_0_{n}")
    # All three are running at once: none can finish before the gate opens.
    assert feed.types(s.id).count("session.tool.success") == 0
    gate.touch()
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    types = feed.types(s.id)
    first_step_end = types.index("session.step.ended")
    terminals = [i for i, t in enumerate(types) if t == "session.tool.success"]
    assert len(terminals) == 3
    assert max(terminals) < first_step_end


async def test_stale_tool_calls_fail_before_any_model_work(runtime: Runtime, feed: Feed) -> None:
    from protocol import ModelRef
    from protocol import events as ev
    from storage import Command

    s = await runtime.sessions.create()
    # What a process that died mid-tool leaves behind.
    for event in (
        ev.StepStarted(
            session_id=s.id,
            assistant_message_id="msg_crashed",
            agent="build",
            model=ModelRef(id="scripted", provider_id="scripted"),
            started=1,
        ),
        ev.ToolCalled(
            session_id=s.id, assistant_message_id="msg_crashed", id="call_x", name="bash", input={}
        ),
    ):
        await runtime.store.append(Command.of(event))
    await runtime.sessions.prompt(s.id, PromptInput(text="carry on"))
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    types = feed.types(s.id)
    # The crashed step's start comes first; the new step starts after the failure.
    starts = [i for i, t in enumerate(types) if t == "session.step.started"]
    assert starts[0] < types.index("session.tool.failed") < starts[1]
    failed = next(m for m in feed.events if m["type"] == "session.tool.failed")
    assert failed["data"]["assistantMessageID"] == "msg_crashed"
    assert failed["data"]["error"] == {
        "type": "aborted",
        "message": "Tool execution interrupted: bash",
    }


async def test_a_content_filter_finish_fails_the_step_and_keeps_partial_text(
    runtime: Runtime, feed: Feed
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(
        s.id, PromptInput(text="#text partial answer\n#finish content-filter")
    )
    terminal = await feed.wait("session.execution.failed", sessionID=s.id)
    assert terminal["data"]["error"]["type"] == "provider.content-filter"
    reply = next(m for m in await messages(runtime, s.id) if isinstance(m, AssistantMessage))
    assert reply.error is not None
    assert reply.error["type"] == "provider.content-filter"
    assert reply.parts == (TextPart(ordinal=0, text="partial answer"),)


async def test_a_provider_failure_fails_the_step_and_the_execution(
    runtime: Runtime, feed: Feed
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="#fail auth"))
    terminal = await feed.wait("session.execution.failed", sessionID=s.id)
    assert terminal["data"]["error"]["type"].startswith("provider.")
    # Before any output the step has no record: the execution carries the error.
    assert "session.step.started" not in feed.types(s.id)
    assert "session.step.failed" not in feed.types(s.id)
    assert await runtime.store.queries.claims() == []
    # After output it has one, failed with the error, its partial text kept.
    before = len(feed.events)
    await runtime.sessions.prompt(s.id, PromptInput(text="#text partial\n#fail auth after-output"))
    await feed.wait("session.execution.failed", after=before, sessionID=s.id)
    failed = await feed.wait("session.step.failed", after=before, sessionID=s.id)
    assert failed["data"]["error"]["type"] == "provider.authentication"
    assert feed.types(s.id).count("session.step.started") == 1


async def test_a_denied_tool_fails_that_call_and_the_step_goes_on(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    s = await runtime.sessions.create(CreateSessionInput(agent="plan"))
    await runtime.sessions.prompt(
        s.id, PromptInput(text='#tool bash {"command": "touch should-not-exist"}\n#step\n#text x')
    )
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    assert not (workdir / "should-not-exist").exists()
    failed = next(m for m in feed.events if m["type"] == "session.tool.failed")
    assert failed["data"]["error"]["type"] == "permission.denied"
    types = feed.types(s.id)
    assert "session.step.failed" not in types
    assert types.count("session.step.started") == 2  # the model gets to react


async def test_switching_agent_applies_from_the_next_step(runtime: Runtime, feed: Feed) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.switch_agent(s.id, "plan")
    await runtime.sessions.prompt(s.id, PromptInput(text="hi"))
    started = await feed.wait("session.step.started", sessionID=s.id)
    assert started["data"]["agent"] == "plan"
    await feed.wait("session.execution.succeeded", sessionID=s.id)


async def test_resume_false_records_without_running(runtime: Runtime, feed: Feed) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="later", resume=False))
    assert await runtime.execution.active() == []
    terminal = await runtime.execution.resume(s.id)
    assert terminal.kind == "succeeded"
    assert len(await messages(runtime, s.id)) == 2


async def test_an_interrupt_while_a_tool_input_streams_still_fails_that_call(
    runtime: Runtime, feed: Feed
) -> None:
    # Found by scripts/crashsim: the part stayed 'streaming' after the step's terminal.
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(
        s.id, PromptInput(text='#delay 50\n#tool bash {"command": "echo hi"}')
    )
    await feed.wait("session.tool.input.started", sessionID=s.id)
    assert await runtime.interrupt(s.id) is True
    await runtime.execution.wait_idle(s.id)
    types = feed.types(s.id)
    assert types.index("session.tool.failed") < types.index("session.step.failed")
    assert "session.tool.called" not in types
    assert await runtime.store.queries.open_tool_calls(s.id) == []


async def test_no_live_delta_is_made_while_nobody_listens(runtime: Runtime) -> None:
    """Deltas are live-only and the bus keeps no history: with no subscriber,
    the step does not make them (the durable reply is whole all the same)."""
    published: list[object] = []
    live = runtime.bus.live
    runtime.bus.live = lambda event: (published.append(event), live(event))[1]  # type: ignore[method-assign]
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="Nobody watches", resume=False))
    terminal = await runtime.execution.resume(s.id)
    assert terminal.kind == "succeeded"
    assert published == []
    _, reply = await messages(runtime, s.id)
    assert isinstance(reply, AssistantMessage)
    assert reply.parts == (TextPart(ordinal=0, text="Scripted reply: Nobody watches"),)
    # Someone listening: the next step's deltas go out.
    runtime.bus.subscribe(lambda message: None)
    await runtime.sessions.prompt(s.id, PromptInput(text="Now someone does", resume=False))
    assert (await runtime.execution.resume(s.id)).kind == "succeeded"
    assert published


async def test_input_admitted_during_a_turn_without_a_wake_runs_at_the_idle_boundary(
    runtime: Runtime, feed: Feed
) -> None:
    """Nothing rings the doorbell for it (``resume: false``): only the idle
    boundary's look at the inbox finds it, in the same busy period."""
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="#delay 200\n#text Slow turn."))
    await feed.wait("session.step.started", sessionID=s.id)
    later = await runtime.sessions.prompt(
        s.id, PromptInput(text="queued meanwhile", delivery="queue", resume=False)
    )
    await runtime.execution.wait_idle(s.id)
    history = await messages(runtime, s.id)
    assert [m.id for m in history if isinstance(m, UserMessage)][-1] == later.id
    assert isinstance(history[-1], AssistantMessage)
    assert await runtime.sessions.pending(s.id) == []
    assert feed.types(s.id).count("session.execution.started") == 1


async def test_the_idle_boundary_after_a_turn_reads_only_where_others_write(
    runtime: Runtime,
) -> None:
    """On a log only this process writes, the inbox the turn's promotion left is
    the inbox; with other hosts on it (PostgreSQL), the boundary reads again."""
    reads: list[str] = []
    queries = runtime.store.queries
    boundary = queries.boundary

    async def counted(session_id: str) -> Any:
        reads.append(session_id)
        return await boundary(session_id)

    queries.boundary = counted  # type: ignore[method-assign]
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="one turn", resume=False))
    assert (await runtime.execution.resume(s.id)).kind == "succeeded"
    assert len(await messages(runtime, s.id)) == 2
    assert reads == ([] if runtime.store.exclusive else [s.id])
    assert runtime.store.exclusive is (runtime.store.path is not None)
