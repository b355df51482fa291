"""Tool settlement exactly as the contract says, through a real runtime.

A real runtime (temp-file SQLite, real tool threads, a real file written)
with an in-process model. The interrupts are placed exactly, never by
sleeping: a tool signals from its thread the moment its work is done, or a
store subscriber reacts the instant a given event has committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from feed import Feed

from actors.agents import Agent
from actors.llm import Finish, ModelRequest, StreamPart, ToolCall
from actors.runtime import Runtime, RuntimeConfig
from actors.session.tool_calls import ToolCalls
from actors.tools import ToolContext, ToolExecutor, ToolResult
from protocol import AssistantMessage, ids
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ModelRef, ToolPart
from storage import Command, RecordedEvent, SQLiteStore

#: Only a guard: waits give up after this instead of hanging.
GUARD = 10.0
MODEL = ModelRef(provider_id="notes", id="m")


class NoteTool:
    """Writes ``note.txt``; finishes its work even when asked to stop meanwhile.

    Once the file is written it tells the loop (``wrote``) and then waits for the
    interrupt to reach it (``ctx.cancel``) before it returns success: the
    interrupt always lands after the operation happened and before the
    success is handed back, the exact window of a late interrupt.
    """

    name = "note"
    description = "write a note"
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    def __init__(self, *, wait_for_cancel: bool) -> None:
        self.wait_for_cancel = wait_for_cancel
        self.wrote = asyncio.Event()
        self.ran = 0
        self._loop = asyncio.get_running_loop()

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        self.ran += 1
        (ctx.directory / "note.txt").write_text(input["text"])
        self._loop.call_soon_threadsafe(self.wrote.set)
        if self.wait_for_cancel:
            ctx.cancel.wait(GUARD)
        return ToolResult.text("wrote note.txt")


class NoteModel:
    """Asks for one note, then (on the next step) answers with nothing more."""

    def __init__(self) -> None:
        self.requests = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        self.requests += 1
        if self.requests == 1:
            yield ToolCall(id="call_note", name="note", input={"text": "remember this"})
            yield Finish(reason="tool-calls")
        else:
            yield Finish(reason="stop")


async def start(tmp_path: Path, workdir: Path, tool: NoteTool) -> tuple[Runtime, Feed]:
    config = RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(workdir),
        providers={"notes": NoteModel()},
        tools=(tool,),
    )
    rt = Runtime(config)
    await rt.__aenter__()
    feed = Feed()
    rt.bus.subscribe(feed)
    return rt, feed


async def tool_part(rt: Runtime, sid: str) -> ToolPart:
    messages = (await rt.sessions.messages(sid, order="asc", limit=200)).data
    (reply,) = [m for m in messages if isinstance(m, AssistantMessage)]
    (part,) = [p for p in reply.parts if isinstance(p, ToolPart)]
    return part


async def test_a_late_interrupt_never_turns_a_success_into_aborted(
    tmp_path: Path, workdir: Path
) -> None:
    tool = NoteTool(wait_for_cancel=True)
    rt, feed = await start(tmp_path, workdir, tool)
    try:
        sid = (await rt.sessions.create(CreateSessionInput(model=MODEL))).id
        await rt.sessions.prompt(sid, PromptInput(text="note it"))
        async with asyncio.timeout(GUARD):
            await tool.wrote.wait()
        assert await rt.interrupt(sid)
        await feed.wait("session.execution.interrupted", sessionID=sid)

        # The write happened, so the durable record says so: success, not aborted.
        assert (workdir / "note.txt").read_text() == "remember this"
        (success,) = [
            m["data"] for m in feed.events if m["type"] == "session.tool.success" and m["durable"]
        ]
        assert success["id"] == "call_note"
        assert success["content"] == [{"type": "text", "text": "wrote note.txt"}]
        types = feed.types(sid)
        assert "session.tool.failed" not in types
        # The step itself was interrupted, after its call had settled.
        assert types.index("session.tool.success") < types.index("session.step.failed")
        part = await tool_part(rt, sid)
        assert part.status == "completed"
        assert part.content == ({"type": "text", "text": "wrote note.txt"},)
        assert await rt.store.queries.open_tool_calls(sid) == []
        assert tool.ran == 1
    finally:
        await rt.__aexit__(None, None, None)


async def test_an_interrupt_while_tool_called_commits_still_settles_the_call(
    tmp_path: Path, workdir: Path
) -> None:
    tool = NoteTool(wait_for_cancel=False)
    rt, feed = await start(tmp_path, workdir, tool)
    try:
        sid = (await rt.sessions.create(CreateSessionInput(model=MODEL))).id

        def interrupt_at_commit(records: Sequence[RecordedEvent]) -> None:
            # Runs as the batch holding tool.called commits, before the step has
            # been told: the interrupt lands inside the step's await on it.
            if any(r.type.startswith("session.tool.called") for r in records):
                (busy,) = [t for t in asyncio.all_tasks() if t.get_name() == f"execution:{sid}"]
                busy.cancel()

        unsubscribe = rt.store.subscribe(interrupt_at_commit)
        try:
            await rt.sessions.prompt(sid, PromptInput(text="note it"))
            await feed.wait("session.execution.interrupted", sessionID=sid)
        finally:
            unsubscribe()

        types = feed.types(sid)
        assert types.count("session.tool.called") == 1
        # The call has its one terminal, durable before the step's terminal.
        assert types.count("session.tool.failed") == 1
        assert types.index("session.tool.failed") < types.index("session.step.failed")
        (failed,) = [
            m["data"] for m in feed.events if m["type"] == "session.tool.failed" and m["durable"]
        ]
        assert failed["id"] == "call_note"
        assert failed["error"]["type"] == "aborted"
        assert failed["executed"] is False
        assert tool.ran == 0
        assert not (workdir / "note.txt").exists()
        assert (await tool_part(rt, sid)).status == "error"
        assert await rt.store.queries.open_tool_calls(sid) == []
    finally:
        await rt.__aexit__(None, None, None)


class StoreJournal:
    """The step's journal, straight onto the runtime's real store."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._submitted: list[asyncio.Future[list[RecordedEvent]]] = []

    def emit(self, event: ev.Event) -> None:
        self._submitted.append(self._store.submit(Command.of(event)))

    async def durable(self, event: ev.Event) -> None:
        self.emit(event)
        await asyncio.shield(self._submitted[-1])

    async def flushed(self) -> None:
        for future in self._submitted:
            await asyncio.shield(future)


async def test_a_call_cancelled_before_its_task_ran_still_gets_its_terminal(
    tmp_path: Path, workdir: Path
) -> None:
    tool = NoteTool(wait_for_cancel=False)
    rt, feed = await start(tmp_path, workdir, tool)
    try:
        session = await rt.sessions.create(CreateSessionInput(model=MODEL))
        journal = StoreJournal(rt.store)
        assistant_id = ids.message_id()
        await journal.durable(
            ev.StepStarted(
                session_id=session.id,
                assistant_message_id=assistant_id,
                agent="build",
                model=MODEL,
                started=0,
            )
        )
        calls = ToolCalls(
            journal=journal,
            session=session,
            agent=Agent(name="build"),
            assistant_id=assistant_id,
            bus=rt.bus,
            executor=ToolExecutor(rt.services.tools, rt.blocking, rt.services.bounding),
            output_dir=rt.config.tool_output_dir,
            secret_env=frozenset(),
            server_dirs=(),
        )
        await calls.called(
            ToolCall(id="call_note", name="note", input={"text": "x"}), limited=False
        )
        # No await in between: the call's task is cancelled before its first step,
        # so its coroutine never runs. cancel() must still settle it durably.
        await calls.cancel()
        calls.fail_unfinished("Tool input interrupted")
        await journal.flushed()

        failed = [
            m["data"] for m in feed.events if m["type"] == "session.tool.failed" and m["durable"]
        ]
        assert [(f["id"], f["error"]["type"], f["executed"]) for f in failed] == [
            ("call_note", "aborted", False)
        ]
        assert tool.ran == 0
        assert await rt.store.queries.open_tool_calls(session.id) == []
    finally:
        await rt.__aexit__(None, None, None)
