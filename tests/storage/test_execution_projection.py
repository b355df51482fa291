"""Projections of execution and step events: claims, assistant messages, parts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protocol import AssistantMessage, Location, ModelRef
from protocol import events as ev
from storage import Command, ProjectionConflict, SQLiteStore, rebuild_projections

SID = "ses_exec"
AID = "msg_assistant1"
MODEL = ModelRef(id="m", provider_id="scripted")


async def setup(store: SQLiteStore) -> None:
    await store.append(
        Command.of(ev.SessionCreated(session_id=SID, title="t", location=Location(directory="/")))
    )


async def append(store: SQLiteStore, *events: ev.Event) -> None:
    for e in events:
        await store.append(Command.of(e))


async def claim_of(store: SQLiteStore) -> tuple[int | None, int]:
    rows = await store.fetch(
        "SELECT time_claimed, resume_attempts FROM session WHERE id = ?", (SID,)
    )
    return rows[0][0], rows[0][1]


@pytest.mark.parametrize(
    ("terminal", "released"),
    [
        (ev.ExecutionSucceeded(session_id=SID), True),
        (ev.ExecutionFailed(session_id=SID, error=ev.ErrorInfo(type="x", message="y")), True),
        (ev.ExecutionInterrupted(session_id=SID, reason="user"), True),
        (ev.ExecutionInterrupted(session_id=SID, reason="shutdown"), False),
    ],
)
async def test_the_claim_is_taken_at_start_and_released_by_terminals(
    store: SQLiteStore, terminal: ev.Event, released: bool
) -> None:
    await setup(store)
    [started] = await store.append(Command.of(ev.ExecutionStarted(session_id=SID)))
    assert await claim_of(store) == (started.created, 0)
    await store.fetch("SELECT 1")  # readers see the commit
    await store.append(Command.of(terminal))
    claimed, _ = await claim_of(store)
    assert (claimed is None) == released
    listed = await store.queries.claims()
    assert [c.session_id for c in listed] == ([] if released else [SID])


async def test_a_resumed_execution_keeps_the_first_claim_time(store: SQLiteStore) -> None:
    await setup(store)
    [first] = await store.append(Command.of(ev.ExecutionStarted(session_id=SID)))
    await append(store, ev.ExecutionInterrupted(session_id=SID, reason="shutdown"))
    await append(store, ev.ExecutionStarted(session_id=SID))
    assert (await claim_of(store))[0] == first.created


async def test_a_step_projects_one_assistant_message_with_ordered_parts(
    store: SQLiteStore, db_path: Path
) -> None:
    await setup(store)
    await append(
        store,
        ev.StepStarted(
            session_id=SID, assistant_message_id=AID, agent="build", model=MODEL, started=5
        ),
        ev.ReasoningStarted(session_id=SID, assistant_message_id=AID, ordinal=0),
        ev.TextStarted(session_id=SID, assistant_message_id=AID, ordinal=0),
        ev.ReasoningEnded(session_id=SID, assistant_message_id=AID, ordinal=0, text="think"),
        ev.TextEnded(session_id=SID, assistant_message_id=AID, ordinal=0, text="hello"),
        ev.ToolInputStarted(session_id=SID, assistant_message_id=AID, id="call_1", name="bash"),
        ev.ToolInputEnded(session_id=SID, assistant_message_id=AID, id="call_1", text="{}"),
        ev.ToolCalled(
            session_id=SID, assistant_message_id=AID, id="call_1", name="bash", input={"c": 1}
        ),
        ev.ToolCalled(session_id=SID, assistant_message_id=AID, id="call_2", name="read", input={}),
    )
    open_calls = await store.queries.open_tool_calls(SID)
    assert [(c.id, c.status) for c in open_calls] == [("call_1", "running"), ("call_2", "running")]
    await append(
        store,
        ev.ToolSucceeded(
            session_id=SID,
            assistant_message_id=AID,
            id="call_1",
            content=({"type": "text", "text": "out"},),
            metadata={"truncated": False},
        ),
        ev.ToolFailed(
            session_id=SID,
            assistant_message_id=AID,
            id="call_2",
            error=ev.ErrorInfo(type="aborted", message="stopped"),
        ),
        ev.StepEnded(
            session_id=SID,
            assistant_message_id=AID,
            finish="tool-calls",
            cost=0.5,
            tokens=ev.StepTokens(input=10, output=3, cache_read=2),
        ),
    )
    assert await store.queries.open_tool_calls(SID) == []
    message = await store.queries.message(SID, AID)
    assert isinstance(message, AssistantMessage)
    assert (message.agent, message.model, message.finish, message.cost) == (
        "build",
        MODEL,
        "tool-calls",
        0.5,
    )
    assert message.tokens is not None
    assert message.tokens.cache.read == 2
    kinds = [
        (p.type, getattr(p, "text", None) or getattr(p, "status", None)) for p in message.parts
    ]
    assert kinds == [
        ("reasoning", "think"),
        ("text", "hello"),
        ("tool", "completed"),
        ("tool", "error"),
    ]
    session = await store.queries.session(SID)
    assert session is not None
    assert (session.cost, session.tokens.input, session.tokens.output) == (0.5, 10, 3)
    await store.close()
    stored, rebuilt = await asyncio.to_thread(rebuild_projections, str(db_path))
    assert stored == rebuilt


async def test_a_tool_terminal_needs_its_call(store: SQLiteStore) -> None:
    await setup(store)
    with pytest.raises(ProjectionConflict):
        await store.append(
            Command.of(
                ev.ToolSucceeded(session_id=SID, assistant_message_id=AID, id="nope", content=())
            )
        )


async def test_a_failed_step_keeps_partial_content(store: SQLiteStore) -> None:
    await setup(store)
    await append(
        store,
        ev.StepStarted(session_id=SID, assistant_message_id=AID, agent="a", model=MODEL, started=1),
        ev.TextStarted(session_id=SID, assistant_message_id=AID, ordinal=0),
        ev.TextEnded(session_id=SID, assistant_message_id=AID, ordinal=0, text="partial"),
        ev.StepFailed(
            session_id=SID,
            assistant_message_id=AID,
            finish="content-filter",
            error=ev.ErrorInfo(type="provider.content-filter", message="filtered"),
        ),
    )
    message = await store.queries.message(SID, AID)
    assert isinstance(message, AssistantMessage)
    assert message.error == {"type": "provider.content-filter", "message": "filtered"}
    assert message.finish == "content-filter"
    assert [getattr(p, "text", None) for p in message.parts] == ["partial"]


async def test_deleting_a_session_removes_its_parts(store: SQLiteStore) -> None:
    await setup(store)
    await append(
        store,
        ev.StepStarted(session_id=SID, assistant_message_id=AID, agent="a", model=MODEL, started=1),
        ev.TextStarted(session_id=SID, assistant_message_id=AID, ordinal=0),
        ev.SessionDeleted(session_id=SID),
    )
    rows = await store.fetch("SELECT count(*) FROM session_part")
    assert rows[0][0] == 0


def spawned(call_id: str = "call_1", pgid: int = 4242) -> ev.ToolSpawned:
    return ev.ToolSpawned(
        session_id=SID,
        assistant_message_id=AID,
        id=call_id,
        pgid=pgid,
        start_ticks=777,
        boot_id="boot-a",
    )


async def running_call(store: SQLiteStore, call_id: str = "call_1") -> None:
    await append(
        store,
        ev.StepStarted(session_id=SID, assistant_message_id=AID, agent="a", model=MODEL, started=1),
        ev.ToolCalled(
            session_id=SID, assistant_message_id=AID, id=call_id, name="bash", input={"c": 1}
        ),
    )


@pytest.mark.parametrize(
    "terminal",
    [
        ev.ToolSucceeded(session_id=SID, assistant_message_id=AID, id="call_1", content=()),
        ev.ToolFailed(
            session_id=SID,
            assistant_message_id=AID,
            id="call_1",
            error=ev.ErrorInfo(type="aborted", message="x"),
        ),
    ],
)
async def test_a_spawned_process_is_recorded_until_the_calls_terminal(
    store: SQLiteStore, terminal: ev.Event, db_path: Path
) -> None:
    await setup(store)
    await running_call(store)
    await append(store, spawned())
    [record] = await store.queries.tool_processes()
    assert (record.session_id, record.assistant_message_id, record.call_id) == (SID, AID, "call_1")
    assert (record.name, record.pgid, record.start_ticks, record.boot_id) == (
        "bash",
        4242,
        777,
        "boot-a",
    )
    assert await store.queries.tool_processes(SID) == [record]
    assert await store.queries.tool_processes("ses_other") == []
    stored, rebuilt = await asyncio.to_thread(rebuild_projections, str(db_path))
    assert stored == rebuilt
    assert stored["tool_process"] != []
    await append(store, terminal)
    assert await store.queries.tool_processes() == []
    stored, rebuilt = await asyncio.to_thread(rebuild_projections, str(db_path))
    assert stored == rebuilt


async def test_a_process_is_recorded_only_for_a_running_call(store: SQLiteStore) -> None:
    await setup(store)
    with pytest.raises(ProjectionConflict) as missing:
        await append(store, spawned())
    assert missing.value.reason == "part.not-running"
    await running_call(store)
    await append(
        store,
        ev.ToolSucceeded(session_id=SID, assistant_message_id=AID, id="call_1", content=()),
    )
    # A record that lost the race with its terminal would name a dead group forever.
    with pytest.raises(ProjectionConflict):
        await append(store, spawned())
    assert await store.queries.tool_processes() == []


async def test_deleting_a_session_forgets_its_processes(store: SQLiteStore) -> None:
    await setup(store)
    await running_call(store)
    await append(store, spawned(), ev.SessionDeleted(session_id=SID))
    assert await store.queries.tool_processes() == []


async def _drain_start_stale(store: SQLiteStore) -> tuple[object, ...]:
    start = await store.queries.drain_start(SID)
    assert start.session is not None
    assert start.session.id == SID
    return (
        [p.call_id for p in start.tool_processes],
        [c.id for c in start.open_tool_calls],
        start.open_step,
        None if start.running_compaction is None else start.running_compaction.status,
    )


async def test_the_drain_start_finds_each_thing_a_crash_can_leave_open(
    store: SQLiteStore,
) -> None:
    """Its first statement only says whether anything is open; each kind alone must say yes."""
    await setup(store)
    clean = ([], [], None, None)
    assert await _drain_start_stale(store) == clean
    # A step with no terminal: an open step, nothing else.
    step = ev.StepStarted(
        session_id=SID, assistant_message_id=AID, agent="a", model=MODEL, started=1
    )
    await append(store, step)
    assert await _drain_start_stale(store) == ([], [], AID, None)
    # A running call in it, then its process group.
    await append(
        store,
        ev.ToolCalled(session_id=SID, assistant_message_id=AID, id="call_1", name="bash", input={}),
    )
    assert await _drain_start_stale(store) == ([], ["call_1"], AID, None)
    await append(store, spawned())
    assert await _drain_start_stale(store) == (["call_1"], ["call_1"], AID, None)
    await append(
        store,
        ev.ToolSucceeded(session_id=SID, assistant_message_id=AID, id="call_1", content=()),
        ev.StepEnded(session_id=SID, assistant_message_id=AID, finish="stop"),
    )
    assert await _drain_start_stale(store) == clean
    # A compaction cut off while running, alone.
    await append(store, ev.CompactionStarted(session_id=SID, reason="auto", recent="[user]\nx"))
    assert await _drain_start_stale(store) == ([], [], None, "running")
    await append(
        store,
        ev.CompactionFailed(
            session_id=SID, reason="auto", error=ev.ErrorInfo(type="x", message="y")
        ),
    )
    assert await _drain_start_stale(store) == clean
    assert (await store.queries.drain_start("ses_missing")).session is None
