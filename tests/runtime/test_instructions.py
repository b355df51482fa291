"""Instructions as value deltas, end to end: sources, admission, request assembly, epochs.

A real runtime on a real SQLite file; a recording provider shows exactly what
the model is sent. Epoch events of other issues (compaction, revert) are
appended directly, as their owners will append them; forks and moves go
through the session facade.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from feed import Feed

from actors import agents
from actors.agents import Agent
from actors.instructions import (
    DISABLE_PROJECT_CONFIG_ENV,
    ENTRY_MAX_BYTES,
    _values,
    digest,
    encode,
    project_config_disabled,
)
from actors.llm import (
    Finish,
    ModelRequest,
    RateLimitError,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
)
from actors.runtime import Runtime, RuntimeConfig
from actors.session import instruction_admission
from protocol import InstructionEntryValueTooLargeError, Location, ModelRef
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import SystemMessage
from storage import Command, RecordedEvent, SQLiteStore

MODEL = ModelRef(id="rec-1", provider_id="rec")


class Recorder:
    """A model that answers "ok" and keeps every request it was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        self.requests.append(request)
        yield TextStart(ordinal=0)
        yield TextChunk(ordinal=0, delta="ok")
        yield TextEnd(ordinal=0)
        yield Finish(reason="stop")


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    # The date is a source: pinned, so a run across midnight cannot add an update.
    monkeypatch.setattr(instruction_admission, "_today", lambda: "2026-12-01")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "pkg").mkdir()
    return root


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def rt(tmp_path: Path, project: Path, recorder: Recorder) -> AsyncIterator[Runtime]:
    config = RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(project / "pkg"),
        providers={"rec": recorder},
    )
    async with Runtime(config) as runtime:
        yield runtime


@pytest.fixture
def feed(rt: Runtime) -> Feed:
    f = Feed()
    rt.bus.subscribe(f)
    return f


async def settled(feed: Feed, session_id: str, n: int, kind: str = "succeeded") -> None:
    """Wait for the n-th terminal of ``kind`` of the session."""
    for _ in range(1000):
        if feed.types(session_id).count(f"session.execution.{kind}") >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {n}th execution.{kind}: {feed.types(session_id)}")


async def turn(rt: Runtime, feed: Feed, session_id: str, text: str, n: int) -> None:
    await rt.sessions.prompt(session_id, PromptInput(text=text))
    await settled(feed, session_id, n)


def updates(feed: Feed, session_id: str) -> list[dict[str, Any]]:
    return [
        e
        for e in feed.events
        if e["type"] == "session.instructions.updated" and e["data"]["sessionID"] == session_id
    ]


def texts(request: ModelRequest) -> list[tuple[str, str]]:
    return [(m.role, "".join(getattr(p, "text", "") for p in m.parts)) for m in request.messages]


async def test_agents_md_baseline_then_one_update_then_removal(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder
) -> None:
    (project / "AGENTS.md").write_text("Root rule: use tabs.\n")
    (project / "pkg" / "AGENTS.md").write_text("Package rule: be brief.\n")
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "first", 1)

    [initial] = updates(feed, s.id)
    assert initial["metadata"] == {"instructions": {"initial": True}}
    assert "text" not in initial["data"] or initial["data"]["text"] is None
    assert set(initial["data"]["delta"]) == {
        "builtin/agent",
        "builtin/environment",
        "discovery/agents",
    }
    baseline = recorder.requests[0].system
    assert len(baseline) == 1
    # Root first, nearest last, each once.
    assert baseline[0].count("Root rule: use tabs.") == 1
    assert baseline[0].index("Root rule") < baseline[0].index("Package rule")
    assert "Today's date: 2026-12-01" in baseline[0]
    assert "sessionrt's build agent" in baseline[0]

    (project / "AGENTS.md").write_text("Root rule: use spaces.\n")
    await turn(rt, feed, s.id, "second", 2)
    changed = updates(feed, s.id)[1]
    assert "metadata" not in changed
    assert list(changed["data"]["delta"]) == ["discovery/agents"]
    assert "Root rule: use spaces." in changed["data"]["text"]
    second = recorder.requests[1]
    assert second.system == baseline  # the baseline stays the epoch's, byte for byte
    chat = texts(second)
    assert [r for r, _ in chat] == ["user", "assistant", "system", "user"]
    assert chat[2][1] == changed["data"]["text"]  # the frozen text, once, before the input
    assert sum("use spaces" in t for _, t in chat) == 1

    # The transcript shows which keys changed.
    history = await rt.sessions.context(s.id)
    [system] = [m for m in history if isinstance(m, SystemMessage)]
    assert system.keys == ("discovery/agents",)

    (project / "AGENTS.md").unlink()
    (project / "pkg" / "AGENTS.md").unlink()
    await turn(rt, feed, s.id, "third", 3)
    removed = updates(feed, s.id)[2]
    assert removed["data"]["delta"] == {"discovery/agents": "removed"}
    assert "no longer apply" in removed["data"]["text"]
    chat = texts(recorder.requests[2])
    assert [t for r, t in chat if r == "system"] == [
        changed["data"]["text"],
        removed["data"]["text"],
    ]

    # Nothing changed: nothing is published, and the request is the same apart from history.
    await turn(rt, feed, s.id, "fourth", 4)
    assert len(updates(feed, s.id)) == 3
    assert recorder.requests[3].system == baseline

    # Every distinct value is stored once, and only the values the deltas name.
    named = {h for u in updates(feed, s.id) for h in u["data"]["delta"].values()} - {"removed"}
    rows = await rt.store.fetch("SELECT hash, value FROM instruction_blob")
    assert {r[0] for r in rows} == named
    assert all(digest(r[1].encode()) == r[0] for r in rows)


async def test_claude_md_is_read_only_where_no_agents_md_is_found(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder
) -> None:
    (project / "CLAUDE.md").write_text("Claude rule.\n")
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "one", 1)
    assert "Claude rule." in recorder.requests[0].system[0]
    (project / "pkg" / "AGENTS.md").write_text("Agents rule.\n")
    await turn(rt, feed, s.id, "two", 2)
    text = updates(feed, s.id)[1]["data"]["text"]
    assert "Agents rule." in text
    assert "Claude rule." not in text


@pytest.mark.parametrize(
    "switch",
    ["config", "OPENCODE_DISABLE_PROJECT_CONFIG", "SESSIONRT_DISABLE_PROJECT_CONFIG"],
)
async def test_project_discovery_can_be_switched_off(
    tmp_path: Path,
    project: Path,
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    switch: str,
) -> None:
    (project / "AGENTS.md").write_text("Project rule.\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "AGENTS.md").write_text("Global rule.\n")
    if switch != "config":
        monkeypatch.setenv(switch, "true" if switch.startswith("OPENCODE") else "1")
    config = RuntimeConfig(
        data_dir=data,
        default_directory=str(project / "pkg"),
        providers={"rec": recorder},
        project_instructions=switch != "config",
    )
    async with Runtime(config) as runtime:
        feed = Feed()
        runtime.bus.subscribe(feed)
        s = await runtime.sessions.create(CreateSessionInput(model=MODEL))
        await turn(runtime, feed, s.id, "go", 1)
    [system] = recorder.requests[0].system
    assert "Global rule." in system
    assert "Project rule." not in system


@pytest.mark.parametrize(
    ("value", "disabled"),
    [("1", True), ("true", True), (" TRUE ", True), ("0", False), ("false", False), ("", False)],
)
def test_only_a_true_switch_disables_project_config(value: str, disabled: bool) -> None:
    for name in DISABLE_PROJECT_CONFIG_ENV:
        assert project_config_disabled({name: value}) is disabled
    assert project_config_disabled({}) is False


async def test_an_unreadable_source_blocks_only_the_first_baseline(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder
) -> None:
    looped = project / "AGENTS.md"
    os.symlink(looped, looped)  # a symlink loop: there, but unreadable (even for root)
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    receipt = await rt.sessions.prompt(s.id, PromptInput(text="wait for me"))
    failed = await feed.wait("session.execution.failed", sessionID=s.id)
    assert failed["data"]["error"]["type"] == "instructions.unavailable"
    assert str(looped) in failed["data"]["error"]["message"]
    assert [i.id for i in await rt.sessions.pending(s.id)] == [receipt.id]  # still pending
    assert updates(feed, s.id) == []
    assert recorder.requests == []
    assert "session.inbox.delivered" not in feed.types(s.id)

    looped.unlink()
    looped.write_text("Readable now.\n")
    rt.execution.wake(s.id)
    await settled(feed, s.id, 1)
    assert await rt.sessions.pending(s.id) == []
    assert "Readable now." in recorder.requests[0].system[0]

    # Afterwards an unreadable source keeps its stored value, without a word.
    looped.unlink()
    os.symlink(looped, looped)
    await turn(rt, feed, s.id, "again", 2)
    assert len(updates(feed, s.id)) == 1
    assert recorder.requests[1].system == recorder.requests[0].system


async def test_api_entries_render_as_context_blocks(
    rt: Runtime, feed: Feed, recorder: Recorder
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await rt.instructions.put(s.id, "style", "terse")
    await rt.instructions.put(s.id, "limits", {"max": 3, "unit": "files"})
    await turn(rt, feed, s.id, "one", 1)
    system = recorder.requests[0].system[0]
    assert '<context key="style">\nterse\n</context>' in system
    assert '<context key="limits">\n{\n  "max": 3,\n  "unit": "files"\n}\n</context>' in system

    await rt.instructions.put(s.id, "style", "terse")  # unchanged: a no-op
    await turn(rt, feed, s.id, "two", 2)
    assert len(updates(feed, s.id)) == 1

    await rt.instructions.put(s.id, "style", "verbose")
    await rt.instructions.remove(s.id, "limits")
    await turn(rt, feed, s.id, "three", 3)
    update = updates(feed, s.id)[1]
    assert update["data"]["delta"] == {
        "api/limits": "removed",
        "api/style": digest(encode("verbose")),
    }
    assert (
        'The context under "style" was replaced:\n<context key="style">\nverbose\n</context>'
        in (update["data"]["text"])
    )
    assert 'The context under "limits" no longer applies.' in update["data"]["text"]
    assert [(e.key, e.value) for e in await rt.instructions.list(s.id)] == [("style", "verbose")]


async def test_an_entry_over_the_limit_is_413_and_stores_nothing(rt: Runtime) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    big = "x" * ENTRY_MAX_BYTES  # with its quotes, two bytes over
    with pytest.raises(InstructionEntryValueTooLargeError) as refused:
        await rt.instructions.put(s.id, "big", big)
    assert refused.value.status == 413
    assert refused.value.fields == {"actualBytes": ENTRY_MAX_BYTES + 2, "maxBytes": ENTRY_MAX_BYTES}
    assert await rt.instructions.list(s.id) == []
    assert await rt.store.fetch("SELECT * FROM instruction_entry") == []
    await rt.instructions.put(s.id, "big", "x" * (ENTRY_MAX_BYTES - 2))  # exactly the limit
    assert [e.key for e in await rt.instructions.list(s.id)] == ["big"]


async def state(rt: Runtime, session_id: str) -> tuple[int, int, dict[str, str], dict[str, str]]:
    [row] = await rt.store.fetch(
        "SELECT epoch_start, through_seq, initial_values, current_values"
        " FROM instruction_state WHERE session_id = ?",
        (session_id,),
    )
    return row[0], row[1], orjson.loads(row[2]), orjson.loads(row[3])


async def test_compaction_makes_current_values_initial(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder
) -> None:
    (project / "AGENTS.md").write_text("v1\n")
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "one", 1)
    (project / "AGENTS.md").write_text("v2\n")
    await turn(rt, feed, s.id, "two", 2)
    _, _, initial, current = await state(rt, s.id)
    assert initial != current
    await rt.store.append(
        Command.of(ev.CompactionStarted(session_id=s.id, reason="auto", recent=""))
    )
    [compacted] = await rt.store.append(
        Command.of(
            ev.CompactionEnded(
                session_id=s.id,
                reason="auto",
                model=ModelRef(id="m1", provider_id="scripted"),
                text="summary",
                recent="",
            )
        )
    )
    epoch, through, initial, now = await state(rt, s.id)
    assert (epoch, through) == (compacted.seq, compacted.seq)
    assert initial == now == current
    await turn(rt, feed, s.id, "three", 3)
    assert len(updates(feed, s.id)) == 2  # no source was read to move the epoch
    system = recorder.requests[2].system[0]
    assert "v2" in system
    assert "v1" not in system


async def test_a_committed_revert_clears_state_for_a_fresh_baseline(
    rt: Runtime, feed: Feed
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "one", 1)
    await rt.store.append(Command.of(ev.RevertCommitted(session_id=s.id, to="msg_x")))
    assert (
        await rt.store.fetch("SELECT 1 FROM instruction_state WHERE session_id = ?", (s.id,)) == []
    )
    await turn(rt, feed, s.id, "two", 2)
    fresh = updates(feed, s.id)[1]
    assert fresh["metadata"] == {"instructions": {"initial": True}}
    assert "builtin/environment" in fresh["data"]["delta"]


async def test_a_fork_adopts_the_parents_newest_values_and_copies_its_entries(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder
) -> None:
    (project / "AGENTS.md").write_text("v1\n")
    parent = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, parent.id, "one", 1)
    (project / "AGENTS.md").write_text("v2\n")
    await rt.instructions.put(parent.id, "tone", "terse")
    await rt.instructions.put(parent.id, "gone", "soon removed")
    await rt.instructions.remove(parent.id, "gone")
    await turn(rt, feed, parent.id, "two", 2)
    _, _, _, newest = await state(rt, parent.id)
    assert "api/tone" in newest

    child = await rt.sessions.fork(parent.id)
    [forked] = [e for e in feed.events if e["type"] == "session.forked"]
    assert forked["data"]["instructions"] == newest
    assert forked["data"]["instructionEntries"] == [{"key": "tone", "value": "terse"}]
    epoch, through, initial, current = await state(rt, child.id)
    assert initial == current == newest
    assert epoch == through == 1  # the fork is the child's first event
    assert [(e.key, e.value) for e in await rt.instructions.list(child.id)] == [("tone", "terse")]

    await turn(rt, feed, child.id, "child", 1)
    assert updates(feed, child.id) == []  # nothing differs from the adopted values
    system = recorder.requests[-1].system[0]
    assert "v2" in system
    assert "v1" not in system
    assert "terse" in system

    # Independent afterwards: a change on either side stays there.
    await rt.instructions.put(parent.id, "tone", "verbose")
    await rt.instructions.put(child.id, "lang", "en")
    assert [(e.key, e.value) for e in await rt.instructions.list(child.id)] == [
        ("lang", "en"),
        ("tone", "terse"),
    ]
    assert [(e.key, e.value) for e in await rt.instructions.list(parent.id)] == [
        ("tone", "verbose")
    ]
    await turn(rt, feed, child.id, "child again", 2)
    [update] = updates(feed, child.id)
    assert update["data"]["delta"].keys() == {"api/lang"}
    await turn(rt, feed, parent.id, "three", 3)
    assert list(updates(feed, parent.id)[-1]["data"]["delta"]) == ["api/tone"]


async def test_a_move_keeps_state_and_the_destinations_sources_arrive_as_updates(
    rt: Runtime, feed: Feed, project: Path, tmp_path: Path, recorder: Recorder
) -> None:
    (project / "AGENTS.md").write_text("Home rule: use tabs.\n")
    other = tmp_path / "other"
    (other / ".git").mkdir(parents=True)
    (other / "AGENTS.md").write_text("Away rule: use spaces.\n")
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "home", 1)
    baseline = recorder.requests[0].system
    assert "Home rule" in baseline[0]
    start, _, initial, _ = await state(rt, s.id)

    await rt.sessions.move(s.id, str(other))
    await feed.wait("session.moved", sessionID=s.id)
    await rt.execution.wait_idle(s.id)
    assert len(updates(feed, s.id)) == 1  # delivery alone reads no source
    await turn(rt, feed, s.id, "away", 3)

    [_, update] = updates(feed, s.id)
    assert "metadata" not in update  # an update, not a fresh baseline
    assert set(update["data"]["delta"]) == {"builtin/environment", "discovery/agents"}
    assert "Away rule: use spaces." in update["data"]["text"]
    assert str(other) in update["data"]["text"]
    # The epoch is the same: the request's baseline is byte for byte the first one,
    # and the destination's values follow it chronologically.
    away = recorder.requests[-1]
    assert away.system == baseline
    chat = texts(away)
    assert [r for r, _ in chat] == ["user", "assistant", "system", "user"]
    assert chat[2][1] == update["data"]["text"]
    epoch, _, kept, current = await state(rt, s.id)
    assert (epoch, kept) == (start, initial)
    assert current["discovery/agents"] != initial["discovery/agents"]


async def test_skills_and_references_from_the_agents_configuration(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = project / "pkg"
    config = work / ".sessionrt"
    for name, description in (("release", "Cut a release."), ("other", "Not allowed.")):
        (config / "skills" / name).mkdir(parents=True)
        (config / "skills" / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: {description}\n---\nThe body stays hidden.\n"
        )
    (config / "agents.toml").write_text(
        '[agents.build]\nreferences = ["docs/Style.md"]\nskills = ["release"]\n'
    )
    (work / "docs").mkdir()
    (work / "docs" / "Style.md").write_text("Short sentences.\n")
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "one", 1)
    [initial] = updates(feed, s.id)
    assert {"skill/available", "reference/docs/style.md"} <= set(initial["data"]["delta"])
    system = recorder.requests[0].system[0]
    assert "- release: Cut a release." in system
    assert "other" not in system
    assert "The body stays hidden." not in system
    assert "Reference docs/Style.md:\nShort sentences." in system

    # A reference leading outside the Location is refused, and says so.
    (config / "agents.toml").write_text('[agents.build]\nreferences = ["../../outside.md"]\n')
    (project.parent / "outside.md").write_text("secret\n")
    # The agent catalog is reused for CATALOG_TTL_S: as if that had passed, not waited out.
    monkeypatch.setattr(agents, "CATALOG_TTL_S", 0)
    fresh = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await rt.sessions.prompt(fresh.id, PromptInput(text="x"))
    failed = await feed.wait("session.execution.failed", sessionID=fresh.id)
    assert "outside the session's directory" in failed["data"]["error"]["message"]
    assert all("secret" not in t for r in recorder.requests for t in r.system)


async def test_a_model_switch_is_no_source_and_an_agent_switch_is_an_update(
    rt: Runtime, feed: Feed, recorder: Recorder
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, s.id, "one", 1)
    await rt.sessions.switch_model(s.id, ModelRef(id="rec-2", provider_id="rec"))
    await turn(rt, feed, s.id, "two", 2)
    assert len(updates(feed, s.id)) == 1
    assert recorder.requests[1].model.id == "rec-2"
    assert recorder.requests[1].system == recorder.requests[0].system
    await rt.sessions.switch_agent(s.id, "plan")
    await turn(rt, feed, s.id, "three", 3)
    update = updates(feed, s.id)[1]
    assert list(update["data"]["delta"]) == ["builtin/agent"]
    assert "planning agent" in update["data"]["text"]
    assert recorder.requests[2].system == recorder.requests[0].system  # the baseline stays
    assert recorder.requests[2].agent == "plan"


async def test_each_step_admits_what_moved_since_steps_that_admitted_nothing(
    rt: Runtime, feed: Feed, monkeypatch: pytest.MonkeyPatch, recorder: Recorder
) -> None:
    """Steps that find nothing to admit remember what they compared; a new day,
    an API entry and an entry's removal still reach the very next step."""
    day = ["2026-12-01"]
    monkeypatch.setattr(instruction_admission, "_today", lambda: day[0])
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    for n in (1, 2, 3):
        await turn(rt, feed, s.id, f"same {n}", n)
    assert len(updates(feed, s.id)) == 1  # the baseline only
    day[0] = "2026-12-02"
    await turn(rt, feed, s.id, "next day", 4)
    assert list(updates(feed, s.id)[-1]["data"]["delta"]) == ["builtin/environment"]  # the date
    await rt.instructions.put(s.id, "style", "terse")
    await turn(rt, feed, s.id, "with an entry", 5)
    assert list(updates(feed, s.id)[-1]["data"]["delta"]) == ["api/style"]
    await turn(rt, feed, s.id, "nothing new", 6)
    assert len(updates(feed, s.id)) == 3
    await rt.instructions.remove(s.id, "style")
    await turn(rt, feed, s.id, "entry gone", 7)
    assert updates(feed, s.id)[-1]["data"]["delta"] == {"api/style": ev.REMOVED}
    assert len(recorder.requests) == 7


def test_the_hash_cache_holds_one_entry_per_distinct_value_whatever_the_sessions() -> None:
    cache = _values.HashCache(max_entries=3)
    prompt = encode({"system": "You are a careful engineer." * 100})
    for _ in range(50):  # fifty sessions sharing one system prompt
        assert cache.digest(encode({"system": "You are a careful engineer." * 100})) == digest(
            prompt
        )
    assert len(cache) == 1
    for n in range(3):
        assert cache.digest(encode(n)) == digest(encode(n))
    assert len(cache) == 1  # over the count bound it started again empty


async def test_a_failed_observation_leaves_no_read_running_and_raises_itself(
    tmp_path: Path, project: Path
) -> None:
    """prepare reads the instruction inputs beside the observation: when the
    observation fails, the read is cancelled and awaited, and the caller gets
    the observation's own error."""
    async with SQLiteStore(tmp_path / "s.sqlite") as store:
        instructions = instruction_admission.Instructions(store=store, data_dir=tmp_path / "data")
        try:
            created = ev.SessionCreated(
                session_id="ses_obs", title="t", location=Location(directory=str(project))
            )
            await store.append(Command.of(created))
            session = await store.queries.session("ses_obs")
            assert session is not None
            reading = asyncio.Event()
            cancelled: list[bool] = []

            async def slow_inputs(session_id: str) -> Any:
                reading.set()
                try:
                    await asyncio.Event().wait()  # hangs until it is cancelled
                except asyncio.CancelledError:
                    cancelled.append(True)
                    raise

            async def failing(spec: Any) -> Any:
                await reading.wait()
                raise OSError("observation failed")

            store.queries.instruction_inputs = slow_inputs  # type: ignore[method-assign]
            instructions._observe = failing  # type: ignore[method-assign]
            agent = Agent(name="build")
            with pytest.raises(OSError, match="observation failed"):
                await instructions.prepare(session, agent)
            assert cancelled == [True]
        finally:
            instructions.close()


class FailsOnce(Recorder):
    """Rate-limited on its first request, then answers like the Recorder."""

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        if not self.requests:
            self.requests.append(request)
            raise RateLimitError("slow down")
        async for part in super().stream(request):
            yield part


async def test_a_source_changed_during_a_retry_wait_is_admitted_before_the_retry(
    tmp_path: Path, project: Path
) -> None:
    model = FailsOnce()
    (project / "AGENTS.md").write_text("Rule: tabs.\n")
    config = RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(project / "pkg"),
        providers={"rec": model},
        retry_base_delay_s=0.001,
    )
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)

        def change_during_wait(records: Sequence[RecordedEvent]) -> None:
            # The retry is durable, its wait not begun: the file changes in the wait.
            if any(r.type.startswith("session.retry.scheduled") for r in records):
                (project / "AGENTS.md").write_text("Rule: spaces.\n")

        unsubscribe = rt.store.subscribe(change_during_wait)
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await turn(rt, feed, s.id, "go", 1)
        unsubscribe()

    first, retry = model.requests
    assert "Rule: tabs." in first.system[0]
    # The same step, its second physical attempt: the update is in its request.
    assert retry.metadata["step"] == first.metadata["step"]
    assert retry.metadata["attempt"] == 2
    _initial, changed = updates(feed, s.id)
    assert list(changed["data"]["delta"]) == ["discovery/agents"]
    assert [t for r, t in texts(retry) if r == "system"] == [changed["data"]["text"]]
    assert "Rule: spaces." in changed["data"]["text"]
    types = feed.types(s.id)
    last_update = max(i for i, t in enumerate(types) if t == "session.instructions.updated")
    assert types.index("session.retry.scheduled") < last_update


async def test_a_changed_source_never_wakes_an_idle_session(
    rt: Runtime, feed: Feed, project: Path, recorder: Recorder
) -> None:
    (project / "AGENTS.md").write_text("Rule one.\n")
    idle = await rt.sessions.create(CreateSessionInput(model=MODEL))
    other = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await turn(rt, feed, idle.id, "first", 1)
    await turn(rt, feed, other.id, "first", 1)
    before = feed.types(idle.id)
    sent = len(recorder.requests)

    (project / "AGENTS.md").write_text("Rule two.\n")
    # The sequencer: another session in the same Location runs a whole turn,
    # observing the change (and draining the kernel's events) at its boundary.
    await turn(rt, feed, other.id, "second", 2)
    assert "Rule two." in updates(feed, other.id)[-1]["data"]["text"]
    assert len(recorder.requests) == sent + 1
    assert feed.types(idle.id) == before  # nothing ran, nothing was admitted
    # The terminal event is published before the supervisor hears the busy period
    # end: wait for the other session's end, then nothing may be active.
    await rt.execution.wait_idle(other.id)
    assert await rt.execution.active() == []
    assert len(updates(feed, idle.id)) == 1

    # The change reaches the idle session lazily, at its next boundary.
    await turn(rt, feed, idle.id, "second", 2)
    assert "Rule two." in updates(feed, idle.id)[-1]["data"]["text"]
