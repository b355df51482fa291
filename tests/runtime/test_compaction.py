"""Compaction end to end: the estimate, the summary + tail, manual control items, overflow.

A real runtime on a temp data dir; the model is the scripted one behind a
recorder, so a test can read every request the model was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from feed import Feed
from manual_clock import ManualClock
from pgdb import stored_and_rebuilt

from actors.llm import ModelLimits, ModelRequest, ScriptedProvider, StreamPart
from actors.runtime import Runtime, RuntimeConfig
from protocol import events as ev
from protocol.errors import ConflictError
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import CompactionMessage, ModelRef, UserMessage
from storage import Command

MODEL = ModelRef(id="small", provider_id="rec")
PAD = "x" * 1000  # about 250 tokens per prompt


class Recorder:
    """The scripted model, keeping every request it was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self._inner = ScriptedProvider()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        self.requests.append(request)
        async for part in self._inner.stream(request):
            yield part

    def steps(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.metadata.get("purpose") != "compaction"]

    def summaries(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.metadata.get("purpose") == "compaction"]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def config(tmp_path: Path, workdir: Path, recorder: Recorder, **overrides: Any) -> RuntimeConfig:
    return RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(workdir),
        providers={"rec": recorder},
        builtin_tools=False,
        model_limits={"rec/small": ModelLimits(context=3000, output=500)},
        compaction_buffer=0,
        compaction_tail_tokens=300,
        **overrides,
    )


@pytest.fixture
async def rt(tmp_path: Path, workdir: Path, recorder: Recorder) -> AsyncIterator[Runtime]:
    async with Runtime(config(tmp_path, workdir, recorder)) as runtime:
        yield runtime


@pytest.fixture
def feed(rt: Runtime) -> Feed:
    f = Feed()
    rt.bus.subscribe(f)
    return f


async def ask(rt: Runtime, session_id: str, text: str) -> None:
    await rt.sessions.prompt(session_id, PromptInput(text=text))
    await rt.execution.wait_idle(session_id)


async def next_event(feed: Feed, after: int, type_: str, within: float = 10) -> dict[str, Any]:
    """The first ``type_`` event recorded after the first ``after`` events."""
    async with asyncio.timeout(within):
        while True:
            for message in feed.events[after:]:
                if message["type"] == type_:
                    return message
            await asyncio.sleep(0.005)


async def slow_prompt(rt: Runtime, feed: Feed, session_id: str, delay_ms: int) -> None:
    """Admit a slowly streaming answer and return once it streams."""
    before = len(feed.events)
    text = f"#delay {delay_ms}\n#chunk 1\n#text a slow answer of many pieces"
    await rt.sessions.prompt(session_id, PromptInput(text=text))
    await next_event(feed, before, "session.text.started")


def durable(feed: Feed, session_id: str) -> list[dict[str, Any]]:
    return [m for m in feed.events if m["data"].get("sessionID") == session_id and m.get("durable")]


async def test_a_long_session_compacts_once_and_keeps_answering(
    rt: Runtime, feed: Feed, recorder: Recorder
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    for i in range(12):
        await ask(rt, s.id, f"note{i:02d} {PAD}")
    events = durable(feed, s.id)
    types = [e["type"] for e in events]
    assert types.count("session.compaction.started") == 1
    assert types.count("session.compaction.ended") == 1
    assert "session.compaction.failed" not in types
    assert types.count("session.execution.succeeded") == 12
    started = next(e for e in events if e["type"] == "session.compaction.started")
    ended = next(e for e in events if e["type"] == "session.compaction.ended")
    assert started["data"]["reason"] == "auto"
    assert ended["data"]["recent"] == started["data"]["recent"]
    assert ended["data"]["model"] == {"id": "small", "providerID": "rec"}
    assert "## Objective" in ended["data"]["text"]
    # The summary streamed live, never stored.
    deltas = [m for m in feed.events if m["type"] == "session.compaction.delta"]
    assert "".join(d["data"]["text"] for d in deltas) == ended["data"]["text"]
    assert all("durable" not in d for d in deltas)
    # Every step after the boundary sees the summary and the tail, nothing older.
    steps = recorder.steps()
    boundary = next(i for i, r in enumerate(steps) if "compacted" in r.messages[0].text)
    for request in steps[boundary:]:
        first = request.messages[0].text
        assert ended["data"]["text"] in first
        assert ended["data"]["recent"] in first
        everything = "\n".join(m.text for m in request.messages)
        # (The default summary names the first request; nothing else older stays.)
        assert "note01" not in everything
    assert "note11" in steps[-1].messages[-1].text
    assert steps[-1].messages[-1].role == "user"
    # The summary request read the older history, not the tail it keeps.
    (summary,) = recorder.summaries()
    assert "note01" in summary.messages[0].text
    # The full transcript stays; the context starts at the compaction.
    page = await rt.sessions.messages(s.id, order="asc", limit=200)
    assert sum(isinstance(m, UserMessage) for m in page.data) == 12
    context = await rt.sessions.context(s.id)
    assert isinstance(context[0], CompactionMessage)
    assert context[0].status == "completed"
    assert all(m.seq >= context[0].seq for m in context)


async def test_the_estimate_anchors_on_reported_tokens(rt: Runtime, recorder: Recorder) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "#usage input=2400 output=10\n#text big")
    # The provider said 2,410 tokens; the next prompt brings the estimate over 2,500.
    await ask(rt, s.id, f"second {PAD}")
    assert [r.metadata.get("purpose") for r in recorder.requests] == [None, "compaction", None]


async def test_a_failed_pre_step_compaction_fails_the_step_without_sending_it(
    rt: Runtime, feed: Feed, recorder: Recorder
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "#summary-fail auth\n#usage input=2400 output=10\n#text big")
    sent = len(recorder.steps())
    await ask(rt, s.id, f"second {PAD}")
    events = durable(feed, s.id)
    types = [e["type"] for e in events]
    assert len(recorder.summaries()) == 1
    [failed] = [e for e in events if e["type"] == "session.compaction.failed"]
    assert failed["data"]["error"]["type"] == "provider.authentication"
    # The request known to be over budget was never sent: no provider overflow,
    # no second (overflow) compaction, no step record.
    assert len(recorder.steps()) == sent
    assert types.count("session.compaction.started") == 1
    assert types[-1] == "session.execution.failed"
    assert events[-1]["data"]["error"] == failed["data"]["error"]
    assert types[types.index("session.compaction.failed") :].count("session.step.started") == 0


async def test_manual_compaction_waits_for_the_running_steps_boundary(
    rt: Runtime, feed: Feed
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "first question")
    await slow_prompt(rt, feed, s.id, 20)
    item = await rt.sessions.compact(s.id)
    assert item.type == "compaction"
    assert item.payload == {}
    # At most one pending: a second request returns the pending one.
    again = await rt.sessions.compact(s.id, "msg_other")
    assert again.id == item.id
    assert [i.id for i in await rt.sessions.pending(s.id)] == [item.id]
    await feed.wait("session.compaction.ended", sessionID=s.id)
    await rt.execution.wait_idle(s.id)
    types = [e["type"] for e in durable(feed, s.id)]
    step_end = len(types) - 1 - types[::-1].index("session.step.ended")
    started = types.index("session.compaction.started")
    assert started > step_end
    assert types[started - 1] == "session.inbox.delivered"
    started_event = durable(feed, s.id)[started]
    assert started_event["data"] == {
        "sessionID": s.id,
        "reason": "manual",
        "recent": "",
        "inputID": item.id,
    }
    # Consumed without becoming a transcript message of its own kind.
    page = await rt.sessions.messages(s.id, order="asc", limit=200)
    assert [m.type for m in page.data] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "compaction",
    ]
    assert await rt.sessions.pending(s.id) == []
    # A delivered id cannot be requested again.
    with pytest.raises(ConflictError):
        await rt.sessions.compact(s.id, item.id)


async def test_a_steer_after_a_pending_compaction_is_delivered_after_it(
    rt: Runtime, feed: Feed
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "first question")
    await slow_prompt(rt, feed, s.id, 20)
    compaction = await rt.sessions.compact(s.id)
    steer = await rt.sessions.prompt(s.id, PromptInput(text="after the checkpoint"))
    await rt.execution.wait_idle(s.id)
    await rt.execution.wait_idle(s.id)
    events = durable(feed, s.id)
    delivered = [e["data"]["inboxID"] for e in events if e["type"] == "session.inbox.delivered"]
    assert delivered[-2:] == [compaction.id, steer.id]
    types = [e["type"] for e in events]
    assert types.index("session.compaction.ended") < len(types) - 1 - types[::-1].index(
        "session.inbox.delivered"
    )
    context = await rt.sessions.context(s.id)
    assert [m.type for m in context][:2] == ["compaction", "user"]


async def test_overflow_once_compacts_and_rebuilds_the_same_step(
    rt: Runtime, feed: Feed, recorder: Recorder
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "earlier question one")
    await ask(rt, s.id, "earlier question two")
    await ask(rt, s.id, "#fail context-overflow once\n#text fits now")
    types = [e["type"] for e in durable(feed, s.id)]
    assert types[-1] == "session.execution.succeeded"
    assert types.count("session.compaction.ended") == 1
    last = recorder.steps()[-2:]
    assert [r.metadata["step"] for r in last] == [1, 1]
    assert [r.metadata["attempt"] for r in last] == [1, 2]
    assert "compacted" in last[1].messages[0].text
    assert "earlier question two" not in "\n".join(m.text for m in last[1].messages)
    # One logical step, one record: the overflow came before any output, so
    # it left none; the rebuilt attempt's output starts the step's one record,
    # after the compaction (so inside the compacted history).
    assert "session.step.failed" not in types
    third = len(types) - 1 - types[::-1].index("session.inbox.delivered")
    tail = types[third:]
    assert tail.count("session.step.started") == 1
    assert tail.index("session.compaction.ended") < tail.index("session.step.started")
    [started] = [e for e in durable(feed, s.id)[third:] if e["type"] == "session.step.started"]
    page = await rt.sessions.messages(s.id, order="desc", limit=1)
    reply = page.data[0]
    assert reply.type == "assistant"
    assert reply.finish == "stop"  # type: ignore[union-attr]
    assert reply.id == started["data"]["assistantMessageID"]
    context = await rt.sessions.context(s.id)
    assert [m.type for m in context][-2:] == ["compaction", "assistant"]


async def test_a_second_overflow_is_terminal(rt: Runtime, feed: Feed) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "earlier question one")
    await ask(rt, s.id, "#fail context-overflow")
    events = durable(feed, s.id)
    assert [e["type"] for e in events].count("session.compaction.ended") == 1
    assert events[-1]["type"] == "session.execution.failed"
    error = events[-1]["data"]["error"]
    assert error["type"] == "provider.context-overflow"
    assert "after compaction" in error["message"]


async def test_an_overflow_after_output_is_terminal(rt: Runtime, feed: Feed) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "earlier question one")
    await ask(rt, s.id, "#text partial\n#fail context-overflow after-output")
    events = durable(feed, s.id)
    assert "session.compaction.started" not in [e["type"] for e in events]
    assert events[-1]["type"] == "session.execution.failed"
    assert "after output" in events[-1]["data"]["error"]["message"]


async def test_overflow_with_auto_compaction_off_is_terminal(
    tmp_path: Path, workdir: Path, recorder: Recorder
) -> None:
    async with Runtime(config(tmp_path, workdir, recorder, compaction=False)) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await ask(rt, s.id, "earlier question one")
        await ask(rt, s.id, "#fail context-overflow once")
        events = durable(feed, s.id)
        assert "session.compaction.started" not in [e["type"] for e in events]
        assert events[-1]["type"] == "session.execution.failed"
        assert "automatic compaction is off" in events[-1]["data"]["error"]["message"]
        # Manual compaction still works with automatic compaction off.
        await rt.sessions.compact(s.id)
        await rt.execution.wait_idle(s.id)
        assert [e["type"] for e in durable(feed, s.id)].count("session.compaction.ended") == 1


async def test_an_agent_may_turn_automatic_compaction_off(
    rt: Runtime, feed: Feed, tmp_path: Path
) -> None:
    (tmp_path / "data" / "agents.toml").write_text("[agents.build]\ncompaction = false\n")
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "earlier question one")
    await ask(rt, s.id, "#fail context-overflow once")
    events = durable(feed, s.id)
    assert events[-1]["type"] == "session.execution.failed"
    assert "session.compaction.started" not in [e["type"] for e in events]


async def test_nothing_to_summarize_fails_a_manual_compaction(rt: Runtime, feed: Feed) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "only question")
    await rt.sessions.compact(s.id)
    await rt.execution.wait_idle(s.id)
    failed = await feed.wait("session.compaction.failed", sessionID=s.id)
    assert failed["data"]["error"]["type"] == "compaction.unavailable"
    context = await rt.sessions.context(s.id)
    assert [m.type for m in context] == ["user", "assistant", "compaction"]
    # The model still sees the whole history (a failed compaction is no boundary).
    assert context[0].type == "user"


async def test_a_cancelled_manual_compaction_ends_aborted(rt: Runtime, feed: Feed) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "#summary-delay 50\n#summary a slow checkpoint of many pieces")
    await ask(rt, s.id, "second question")
    before = len(feed.events)
    await rt.sessions.compact(s.id)
    await next_event(feed, before, "session.compaction.delta")
    assert await rt.execution.interrupt(s.id)
    await rt.execution.wait_idle(s.id)
    failed = await feed.wait("session.compaction.failed", sessionID=s.id)
    assert failed["data"]["reason"] == "manual"
    assert failed["data"]["error"]["type"] == "aborted"
    assert (await rt.store.queries.running_compaction(s.id)) is None


async def test_interrupt_then_resume_wakes_for_a_pending_compaction(
    rt: Runtime, feed: Feed
) -> None:
    s = await rt.sessions.create(CreateSessionInput(model=MODEL))
    await ask(rt, s.id, "first question")
    await slow_prompt(rt, feed, s.id, 50)
    item = await rt.sessions.compact(s.id)
    assert await rt.interrupt(s.id, resume=True)
    ended = await feed.wait("session.compaction.ended", sessionID=s.id)
    assert ended["data"]["reason"] == "manual"
    await rt.execution.wait_idle(s.id)
    assert item.id not in [i.id for i in await rt.sessions.pending(s.id)]


async def test_a_crash_during_compaction_recovers_consistently(
    tmp_path: Path, workdir: Path, recorder: Recorder
) -> None:
    async with Runtime(config(tmp_path, workdir, recorder)) as rt:
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await ask(rt, s.id, "first question")
        await ask(rt, s.id, "second question")
        # What a process killed mid-compaction leaves: a claim and a running compaction.
        await rt.store.append(
            Command.of(
                ev.ExecutionStarted(session_id=s.id),
                ev.CompactionStarted(session_id=s.id, reason="auto", recent="[user]\nsecond"),
            )
        )
    async with Runtime(config(tmp_path, workdir, recorder)) as rt:
        await rt.execution.wait_idle(s.id)
        assert await rt.store.queries.running_compaction(s.id) is None
        context = await rt.sessions.context(s.id)
        stale = [m for m in context if isinstance(m, CompactionMessage)]
        assert [(m.status, (m.error or {}).get("type")) for m in stale] == [
            ("failed", "compaction.interrupted")
        ]
        # No boundary: the model still sees the whole history.
        assert context[0].type == "user"
        assert await rt.store.queries.claims() == []
        # And it still compacts afterwards.
        await rt.sessions.compact(s.id)
        await rt.execution.wait_idle(s.id)
        assert (await rt.sessions.context(s.id))[0].type == "compaction"


async def test_a_manual_compaction_cut_off_by_a_crash_runs_again_once(
    tmp_path: Path, workdir: Path, recorder: Recorder
) -> None:
    async with Runtime(config(tmp_path, workdir, recorder)) as rt:
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await ask(rt, s.id, "first question")
        await ask(rt, s.id, "second question")
        # A process killed mid-compaction: a claim, a delivered manual compaction running.
        await rt.store.append(
            Command.of(
                ev.ExecutionStarted(session_id=s.id),
                ev.CompactionStarted(
                    session_id=s.id, reason="manual", recent="", input_id="msg_cutoff"
                ),
            )
        )
    async with Runtime(config(tmp_path, workdir, recorder)) as rt:
        await rt.execution.wait_idle(s.id)
        assert await rt.store.queries.claims() == []
        context = await rt.sessions.context(s.id)
        assert isinstance(context[0], CompactionMessage)
        assert (context[0].id, context[0].status) == ("msg_cutoff-recovered", "completed")
        assert context[0].reason == "manual"
        cut = await rt.sessions.message(s.id, "msg_cutoff")
        assert isinstance(cut, CompactionMessage)
        assert (cut.status, (cut.error or {}).get("type")) == ("failed", "compaction.interrupted")
        assert len(recorder.summaries()) == 1
        # Cut off again, the second run only fails: it is recovered once.
        await rt.store.append(
            Command.of(
                ev.ExecutionStarted(session_id=s.id),
                ev.CompactionStarted(
                    session_id=s.id, reason="manual", recent="", input_id="msg_again-recovered"
                ),
            )
        )
    async with Runtime(config(tmp_path, workdir, recorder)) as rt:
        await rt.execution.wait_idle(s.id)
        assert await rt.store.queries.running_compaction(s.id) is None
        again = await rt.sessions.message(s.id, "msg_again-recovered")
        assert isinstance(again, CompactionMessage)
        assert again.status == "failed"
        assert len(recorder.summaries()) == 1
        compactions = [
            m.id
            for m in (await rt.sessions.messages(s.id, order="asc", limit=200)).data
            if isinstance(m, CompactionMessage)
        ]
        assert compactions == ["msg_cutoff", "msg_cutoff-recovered", "msg_again-recovered"]


async def test_replay_rebuilds_the_compaction_projections(
    tmp_path: Path, workdir: Path, recorder: Recorder
) -> None:
    async with Runtime(config(tmp_path, workdir, recorder)) as rt:
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        for i in range(3):
            await ask(rt, s.id, f"question {i}")
        await rt.sessions.compact(s.id)
        await rt.execution.wait_idle(s.id)
        await ask(rt, s.id, "#fail context-overflow once")
        await ask(rt, s.id, "only")
        assert (await rt.sessions.context(s.id))[0].type == "compaction"
    stored, rebuilt = await stored_and_rebuilt(rt.store)
    assert stored == rebuilt


def test_runtime_config_knows_limits_of_configured_and_given_models(tmp_path: Path) -> None:
    from actors.llm import ProviderConfig

    cfg = RuntimeConfig(
        data_dir=tmp_path,
        provider_configs={
            "local": ProviderConfig(
                id="local",
                kind="openai",
                base_url="http://127.0.0.1:1/v1",
                models={"m": ModelLimits(context=100, output=10)},
            )
        },
        model_limits={"scripted/scripted": ModelLimits(context=50, output=5)},
    )
    assert cfg.limits(ModelRef(id="m", provider_id="local")) == ModelLimits(context=100, output=10)
    assert cfg.limits(ModelRef(id="scripted", provider_id="scripted")) == ModelLimits(
        context=50, output=5
    )
    assert cfg.limits(ModelRef(id="other", provider_id="local")) is None
    assert attrs.asdict(cfg)["compaction"] is True


async def test_a_summary_request_is_retried_once_its_backoff_has_passed_on_the_clock(
    tmp_path: Path, workdir: Path, recorder: Recorder
) -> None:
    clock = ManualClock()
    # A minute's backoff and a day's lease: nothing here moves unless the test says so.
    settings = config(
        tmp_path, workdir, recorder, retry_base_delay_s=60, lease_ttl_ms=86_400_000, clock=clock
    )
    async with Runtime(settings) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await ask(rt, s.id, "#summary-fail rate-limit once\n#summary ## Objective\nfirst")
        await ask(rt, s.id, "second question")
        await rt.sessions.compact(s.id)

        def backoff() -> list[int]:
            # The first backoff, jittered by 0.8-1.2: no other wait is that far off.
            return [d for d in clock.waits() if 48_000 <= d - clock.now_ms() <= 72_000]

        await clock.until(lambda: bool(backoff()))
        (due,) = backoff()
        clock.advance(due - 1 - clock.now_ms())
        assert due in clock.waits()  # not yet
        await rt.sessions.get(s.id)  # a round trip: the loop ran what the advance woke
        assert [r.metadata["attempt"] for r in recorder.summaries()] == [1]
        clock.advance(1)
        ended = await feed.wait("session.compaction.ended", sessionID=s.id)
        assert ended["data"]["text"] == "## Objective"
        assert [r.metadata["attempt"] for r in recorder.summaries()] == [1, 2]
        await rt.execution.wait_idle(s.id)


async def test_a_compactions_requests_share_one_retry_allowance(
    tmp_path: Path, workdir: Path, recorder: Recorder
) -> None:
    async with Runtime(config(tmp_path, workdir, recorder, retry_base_delay_s=0.001)) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await ask(rt, s.id, "#summary-fail rate-limit attempts=2\n#summary ## Objective\nfirst")
        await ask(rt, s.id, "second question")
        await rt.sessions.compact(s.id)
        await rt.execution.wait_idle(s.id)
        ended = await feed.wait("session.compaction.ended", sessionID=s.id)
        assert ended["data"]["text"] == "## Objective"
        assert [r.metadata["attempt"] for r in recorder.summaries()] == [1, 2, 3]

        t = await rt.sessions.create(CreateSessionInput(model=MODEL))
        await ask(rt, t.id, "#summary-fail rate-limit\nfirst")
        await ask(rt, t.id, "second question")
        before = len(recorder.summaries())
        await rt.sessions.compact(t.id)
        await rt.execution.wait_idle(t.id)
        failed = await feed.wait("session.compaction.failed", sessionID=t.id)
        assert failed["data"]["error"]["type"] == "provider.rate-limit"
        # The first request and four retries, then the compaction gives up.
        assert len(recorder.summaries()) - before == 5
        context = await rt.sessions.context(t.id)
        assert context[0].type == "user"  # no boundary after a failed compaction
