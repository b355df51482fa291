"""The attempt loop inside the step, through the real adapters and a fake provider.

Every scenario runs a real runtime (temp-file SQLite) against
``llm.fake_providers.FakeProvider`` on loopback, speaking the OpenAI or the
Anthropic wire format. Backoff delays are shortened through ``[runtime]``
(``retry_base_delay_s``), or waited on a clock the test advances
(``RuntimeConfig.clock``), never waited out by the test's own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from feed import Feed
from llm.fake_providers import (
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_events,
    anthropic_text,
    openai_error,
    openai_text,
)
from manual_clock import ManualClock
from pgdb import stored_and_rebuilt

from actors.llm import (
    ModelLimits,
    ModelRequest,
    ProviderConfig,
    StreamPart,
    ToolCall,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
)
from actors.runtime import Runtime, RuntimeConfig
from actors.session.step import CONTINUE_TEXT
from protocol import AssistantMessage, SyntheticMessage
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ModelRef, ReasoningPart, TextPart, ToolPart

OPENAI = ModelRef(provider_id="oa", id="gpt-fake")
ANTHROPIC = ModelRef(provider_id="an", id="claude-fake")
SECRET = "sk-test-0123456789abcdef"


def providers(fake: FakeProvider) -> dict[str, ProviderConfig]:
    limits = {"context": 100_000, "output": 1000}
    return {
        "oa": ProviderConfig(
            id="oa",
            kind="openai",
            base_url=fake.openai_url,
            api_key_env="ATTEMPTS_TEST_KEY",
            models={"gpt-fake": ModelLimits(**limits)},
        ),
        "an": ProviderConfig(
            id="an",
            kind="anthropic",
            base_url=fake.anthropic_url,
            api_key_env="ATTEMPTS_TEST_KEY",
            models={"claude-fake": ModelLimits(**limits), "claude-other": ModelLimits(**limits)},
        ),
    }


def runtime_config(tmp_path: Path, workdir: Path, fake: FakeProvider, **kw: Any) -> RuntimeConfig:
    kw.setdefault("retry_base_delay_s", 0.001)
    return RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(workdir),
        provider_configs=providers(fake),
        **kw,
    )


@attrs.define
class World:
    rt: Runtime
    fake: FakeProvider
    feed: Feed

    async def session(self, model: ModelRef = OPENAI) -> str:
        return (await self.rt.sessions.create(CreateSessionInput(model=model))).id

    async def run(self, session_id: str, text: str = "hello") -> Any:
        await self.rt.sessions.prompt(session_id, PromptInput(text=text, resume=False))
        return await self.rt.execution.resume(session_id)

    async def assistants(self, session_id: str) -> list[AssistantMessage]:
        page = await self.rt.sessions.messages(session_id, order="asc", limit=200)
        return [m for m in page.data if isinstance(m, AssistantMessage)]

    def durable(self, session_id: str, type_: str) -> list[dict[str, Any]]:
        return [
            m["data"]
            for m in self.feed.events
            if m.get("durable") and m["type"] == type_ and m["data"]["sessionID"] == session_id
        ]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTEMPTS_TEST_KEY", SECRET)


@pytest.fixture
async def world(tmp_path: Path, workdir: Path) -> AsyncIterator[World]:
    async with FakeProvider() as fake, Runtime(runtime_config(tmp_path, workdir, fake)) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        yield World(rt=rt, fake=fake, feed=feed)


async def replay_matches(rt: Runtime) -> None:
    stored, rebuilt = await stored_and_rebuilt(rt.store)
    assert stored == rebuilt


# -- generic retry before output --------------------------------------------------------------


async def test_a_429_with_retry_after_is_retried_on_the_same_message(world: World) -> None:
    sid = await world.session()
    world.fake.replies.append(
        openai_error(429, "Rate limit reached", type="requests", **{"retry-after-ms": "150"})
    )
    world.fake.replies.append(Reply.stream(openai_text(["Hel", "lo"])))
    terminal = await world.run(sid)
    assert terminal.kind == "succeeded"
    (scheduled,) = world.durable(sid, "session.retry.scheduled")
    (started,) = world.durable(sid, "session.step.started")
    assert scheduled["assistantMessageID"] == started["assistantMessageID"]
    assert scheduled["attempt"] == 1
    assert scheduled["error"]["type"] == "provider.rate-limit"
    # The provider's retry-after is a floor: the retry was scheduled, and made,
    # no sooner than 150 ms after the 429 was answered.
    first, second = world.fake.received
    assert scheduled["at"] >= first.time_ms + 150
    assert second.time_ms >= scheduled["at"] - 1
    (reply,) = await world.assistants(sid)
    assert reply.id == started["assistantMessageID"]
    assert reply.parts == (TextPart(ordinal=0, text="Hello"),)
    assert reply.error is None
    # Later activity cleared the retry; the retry resent the same request.
    assert (await world.rt.sessions.get(sid)).retry is None
    assert first.body == second.body
    await replay_matches(world.rt)


async def test_retry_after_is_capped_by_the_configured_maximum(
    tmp_path: Path, workdir: Path
) -> None:
    async with FakeProvider() as fake:
        config = runtime_config(tmp_path, workdir, fake, retry_max_delay_s=0.01)
        async with Runtime(config) as rt:
            sid = (await rt.sessions.create(CreateSessionInput(model=OPENAI))).id
            # An hour's retry-after would hang this test (and its timeout) uncapped.
            fake.replies.append(
                openai_error(429, "slow down", type="requests", **{"retry-after": "3600"})
            )
            fake.replies.append(Reply.stream(openai_text(["ok"])))
            await rt.sessions.prompt(sid, PromptInput(text="hi", resume=False))
            assert (await rt.execution.resume(sid)).kind == "succeeded"


@pytest.mark.parametrize(
    ("model", "failure"),
    [
        (ANTHROPIC, anthropic_error(529, "overloaded_error", "Overloaded")),
        (OPENAI, openai_error(503, "The server is overloaded", type="server_error")),
    ],
    ids=["anthropic-529", "openai-503"],
)
async def test_an_overloaded_provider_is_retried(
    world: World, model: ModelRef, failure: Reply
) -> None:
    sid = await world.session(model)
    world.fake.replies.extend([failure, failure])
    frames = anthropic_text(["fine"]) if model == ANTHROPIC else openai_text(["fine"])
    world.fake.replies.append(Reply.stream(frames))
    assert (await world.run(sid)).kind == "succeeded"
    scheduled = world.durable(sid, "session.retry.scheduled")
    assert [s["attempt"] for s in scheduled] == [1, 2]
    assert {s["error"]["type"] for s in scheduled} == {"provider.internal"}
    (reply,) = await world.assistants(sid)
    assert {s["assistantMessageID"] for s in scheduled} == {reply.id}
    assert reply.parts == (TextPart(ordinal=0, text="fine"),)
    assert len(world.fake.received) == 3


async def test_the_budget_is_the_first_try_plus_four_retries(world: World) -> None:
    sid = await world.session()
    world.fake.replies.extend([openai_error(503, "unavailable", type="server_error")] * 6)
    terminal = await world.run(sid)
    assert terminal.kind == "failed"
    assert terminal.error.type == "provider.internal"
    assert [s["attempt"] for s in world.durable(sid, "session.retry.scheduled")] == [1, 2, 3, 4]
    assert len(world.fake.received) == 5
    # No output, so no record: the execution's terminal carries the error.
    assert await world.assistants(sid) == []
    assert world.durable(sid, "session.step.started") == []
    assert (await world.rt.sessions.get(sid)).retry is None  # the terminal cleared it
    await replay_matches(world.rt)


async def test_a_stream_cut_before_output_is_retried_on_the_same_message(world: World) -> None:
    sid = await world.session()
    # Only the role chunk arrives, then the body ends: nothing was shown.
    world.fake.replies.append(Reply.stream(openai_text(["never"]), cut_after=1))
    world.fake.replies.append(Reply.stream(openai_text(["whole"])))
    assert (await world.run(sid)).kind == "succeeded"
    (scheduled,) = world.durable(sid, "session.retry.scheduled")
    assert scheduled["error"]["type"] == "provider.incomplete-stream"
    (reply,) = await world.assistants(sid)
    assert reply.id == scheduled["assistantMessageID"]
    assert reply.parts == (TextPart(ordinal=0, text="whole"),)
    # One step, one record, written at the retried attempt's first output.
    (started,) = world.durable(sid, "session.step.started")
    assert started["assistantMessageID"] == reply.id
    types = [m["type"] for m in world.feed.events if m.get("durable")]
    assert types.index("session.retry.scheduled") < types.index("session.step.started")


# -- continuation after output ----------------------------------------------------------------


async def test_a_stream_cut_after_output_keeps_the_partial_and_continues(world: World) -> None:
    sid = await world.session(ANTHROPIC)
    frames = anthropic_text(["Hel", "lo, wor"])
    # message_start, ping, block start, two deltas: then the connection breaks.
    world.fake.replies.append(Reply.stream(frames, reset_after=5))
    world.fake.replies.append(Reply.stream(anthropic_text(["ld!"])))
    assert (await world.run(sid)).kind == "succeeded"
    partial, rest = await world.assistants(sid)
    assert partial.parts == (TextPart(ordinal=0, text="Hello, wor"),)
    assert partial.error is not None
    assert partial.error["type"] == "provider.incomplete-stream"
    assert rest.id != partial.id
    assert rest.parts == (TextPart(ordinal=0, text="ld!"),)
    assert rest.error is None
    assert rest.finish == "stop"
    (scheduled,) = world.durable(sid, "session.retry.scheduled")
    assert scheduled["assistantMessageID"] == partial.id
    page = await world.rt.sessions.messages(sid, order="asc", limit=200)
    notices = [m for m in page.data if isinstance(m, SyntheticMessage)]
    assert [n.text for n in notices] == [CONTINUE_TEXT]
    # The continuation request carries the partial answer and the instruction.
    sent = world.fake.received[1].body["messages"]
    assert sent[-2] == {"role": "assistant", "content": [{"type": "text", "text": "Hello, wor"}]}
    assert sent[-1] == {"role": "user", "content": [{"type": "text", "text": CONTINUE_TEXT}]}
    await replay_matches(world.rt)


# -- failures that are not retried ------------------------------------------------------------


async def test_context_overflow_fails_clearly_without_a_retry(world: World) -> None:
    sid = await world.session()
    world.fake.replies.append(
        openai_error(
            400,
            "This model's maximum context length is 128000 tokens.",
            type="invalid_request_error",
            code="context_length_exceeded",
        )
    )
    terminal = await world.run(sid)
    assert terminal.kind == "failed"
    assert terminal.error.type == "provider.context-overflow"
    assert "maximum context length" in terminal.error.message
    assert world.durable(sid, "session.retry.scheduled") == []
    assert len(world.fake.received) == 1


async def test_a_401_fails_the_execution_without_a_retry_or_the_key(world: World) -> None:
    sid = await world.session(ANTHROPIC)
    world.fake.replies.append(
        anthropic_error(401, "authentication_error", f"invalid x-api-key {SECRET}")
    )
    terminal = await world.run(sid)
    assert terminal.kind == "failed"
    assert terminal.error.type == "provider.authentication"
    assert SECRET not in terminal.error.message
    assert world.durable(sid, "session.retry.scheduled") == []
    assert len(world.fake.received) == 1
    (failed,) = world.durable(sid, "session.execution.failed")
    assert failed["error"]["type"] == "provider.authentication"
    assert SECRET not in str(world.feed.events)


async def test_a_content_filter_fails_the_step_and_keeps_the_partial(world: World) -> None:
    sid = await world.session()
    world.fake.replies.append(Reply.stream(openai_text(["Some of it"], finish="content_filter")))
    terminal = await world.run(sid)
    assert terminal.kind == "failed"
    assert terminal.error.type == "provider.content-filter"
    (reply,) = await world.assistants(sid)
    assert reply.parts == (TextPart(ordinal=0, text="Some of it"),)
    assert reply.finish == "content-filter"
    assert world.durable(sid, "session.retry.scheduled") == []


# -- interrupts and crashes -------------------------------------------------------------------


async def test_an_interrupt_mid_stream_keeps_what_streamed(world: World) -> None:
    sid = await world.session()
    frames = openai_text(["Half ", "an answer"])
    # Role chunk and two text chunks, then silence.
    world.fake.replies.append(Reply.stream(frames[:3], hang=True))
    await world.rt.sessions.prompt(sid, PromptInput(text="go"))
    await world.feed.wait("session.text.delta", sessionID=sid, delta="an answer")
    assert await world.rt.interrupt(sid)
    await world.feed.wait("session.execution.interrupted", sessionID=sid)
    (reply,) = await world.assistants(sid)
    assert reply.parts == (TextPart(ordinal=0, text="Half an answer"),)
    assert reply.error is not None
    assert reply.error["type"] == "aborted"
    await replay_matches(world.rt)


async def test_an_interrupt_ends_the_backoff_at_once(tmp_path: Path, workdir: Path) -> None:
    async with FakeProvider() as fake:
        # An hour's backoff: only the interrupt can end this test in time.
        config = runtime_config(tmp_path, workdir, fake, retry_base_delay_s=3600)
        async with Runtime(config) as rt:
            feed = Feed()
            rt.bus.subscribe(feed)
            sid = (await rt.sessions.create(CreateSessionInput(model=OPENAI))).id
            fake.replies.append(openai_error(503, "unavailable", type="server_error"))
            await rt.sessions.prompt(sid, PromptInput(text="go"))
            scheduled = await feed.wait("session.retry.scheduled", sessionID=sid)
            waiting = (await rt.sessions.get(sid)).retry
            assert waiting is not None
            assert waiting.attempt == 1
            assert waiting.at == scheduled["data"]["at"]
            assert waiting.error["type"] == "provider.internal"
            assert waiting.assistant_message_id == scheduled["data"]["assistantMessageID"]
            assert await rt.interrupt(sid)
            await feed.wait("session.execution.interrupted", sessionID=sid)
            assert (await rt.sessions.get(sid)).retry is None
            assert len(fake.received) == 1
            messages = (await rt.sessions.messages(sid, order="asc", limit=200)).data
            # Interrupted before any output: no assistant message was ever recorded.
            assert [m for m in messages if isinstance(m, AssistantMessage)] == []
            assert "session.step.started" not in feed.types(sid)
            await replay_matches(rt)


async def test_a_retry_fires_once_its_backoff_has_passed_on_the_runtime_clock(
    tmp_path: Path, workdir: Path
) -> None:
    """Not a millisecond before ``at``: the backoff is a wait on the runtime's clock."""
    clock = ManualClock()
    async with FakeProvider() as fake:
        # A minute's backoff and a day's lease: nothing here moves unless the test says so.
        config = runtime_config(
            tmp_path, workdir, fake, retry_base_delay_s=60, lease_ttl_ms=86_400_000, clock=clock
        )
        async with Runtime(config) as rt:
            feed = Feed()
            rt.bus.subscribe(feed)
            sid = (await rt.sessions.create(CreateSessionInput(model=OPENAI))).id
            fake.replies.append(openai_error(503, "unavailable", type="server_error"))
            fake.replies.append(Reply.stream(openai_text(["late"])))
            await rt.sessions.prompt(sid, PromptInput(text="go"))
            scheduled = await feed.wait("session.retry.scheduled", sessionID=sid)
            at = scheduled["data"]["at"]
            delay = at - clock.now_ms()
            assert 48_000 <= delay <= 72_000  # the first backoff, jittered by 0.8-1.2
            await clock.until_waiting(at)
            clock.advance(delay - 1)
            assert at in clock.waits()  # the backoff has not ended
            # A round trip through the store (the loop ran): still waiting, nothing resent.
            waiting = (await rt.sessions.get(sid)).retry
            assert waiting is not None
            assert waiting.at == at
            assert len(fake.received) == 1
            clock.advance(1)
            assert at not in clock.waits()
            await feed.wait("session.execution.succeeded", sessionID=sid)
            assert len(fake.received) == 2
            (reply,) = [
                m
                for m in (await rt.sessions.messages(sid, order="asc", limit=200)).data
                if isinstance(m, AssistantMessage)
            ]
            assert reply.parts == (TextPart(ordinal=0, text="late"),)


# -- native continuation state ----------------------------------------------------------------


def thinking_answer(text: str, signature: str) -> list[bytes]:
    return anthropic_events(
        [
            (
                {"type": "thinking", "thinking": ""},
                [
                    {"type": "thinking_delta", "thinking": "pondering"},
                    {"type": "signature_delta", "signature": signature},
                ],
            ),
            ({"type": "text", "text": ""}, [{"type": "text_delta", "text": text}]),
        ]
    )


def thinking_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body["messages"]
        for block in message["content"]
        if block.get("type") == "thinking"
    ]


async def test_provider_state_is_stored_and_replayed_to_the_same_model_only(
    world: World,
) -> None:
    sid = await world.session(ANTHROPIC)
    world.fake.replies.append(Reply.stream(thinking_answer("first", "sig-abc")))
    assert (await world.run(sid)).kind == "succeeded"
    (ended,) = world.durable(sid, "session.step.ended")
    assert ended["providerState"] == {"reasoning": {"0": "sig-abc"}}
    (reply,) = await world.assistants(sid)
    assert reply.provider_state == {"reasoning": {"0": "sig-abc"}}
    assert reply.parts[0] == ReasoningPart(ordinal=0, text="pondering")
    world.fake.replies.append(Reply.stream(anthropic_text(["second"])))
    assert (await world.run(sid, "again")).kind == "succeeded"
    assert thinking_blocks(world.fake.received[1].body) == [
        {"type": "thinking", "thinking": "pondering", "signature": "sig-abc"}
    ]
    await world.rt.sessions.switch_model(sid, ModelRef(provider_id="an", id="claude-other"))
    world.fake.replies.append(Reply.stream(anthropic_text(["third"])))
    assert (await world.run(sid, "other model")).kind == "succeeded"
    assert thinking_blocks(world.fake.received[2].body) == []
    await replay_matches(world.rt)


async def test_a_rejected_signature_rebuilds_the_request_once_without_a_retry(
    world: World,
) -> None:
    sid = await world.session(ANTHROPIC)
    world.fake.replies.append(Reply.stream(thinking_answer("first", "sig-stale")))
    assert (await world.run(sid)).kind == "succeeded"
    world.fake.replies.append(
        anthropic_error(
            400,
            "invalid_request_error",
            "messages.1.content.0: Invalid `signature` in `thinking` block",
        )
    )
    world.fake.replies.append(Reply.stream(anthropic_text(["rebuilt"])))
    assert (await world.run(sid, "again")).kind == "succeeded"
    assert world.durable(sid, "session.retry.scheduled") == []
    rejected, rebuilt = world.fake.received[1:]
    assert len(thinking_blocks(rejected.body)) == 1
    assert thinking_blocks(rebuilt.body) == []
    _, second = await world.assistants(sid)
    assert second.parts == (TextPart(ordinal=0, text="rebuilt"),)
    assert second.error is None
    # Two steps, two records: the rejected attempt left none of its own.
    assert len(world.durable(sid, "session.step.started")) == 2
    assert world.durable(sid, "session.step.failed") == []


async def test_a_second_rejection_fails_the_step(world: World) -> None:
    sid = await world.session(ANTHROPIC)
    world.fake.replies.append(Reply.stream(thinking_answer("first", "sig-stale")))
    assert (await world.run(sid)).kind == "succeeded"
    rejection = anthropic_error(
        400, "invalid_request_error", "Invalid `signature` in `thinking` block"
    )
    world.fake.replies.extend([rejection, rejection])
    terminal = await world.run(sid, "again")
    assert terminal.kind == "failed"
    assert terminal.error.type == "provider.continuation-rejected"
    assert len(world.fake.received) == 3
    # The failed step never produced output: only the first step has a record.
    assert len(await world.assistants(sid)) == 1


# -- structured concurrency -------------------------------------------------------------------


class BrokenModel:
    """A model whose stream calls a tool, then fails with a bug while the tool runs."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        yield ToolInputStart(id="call_1", name="bash")
        yield ToolInputChunk(id="call_1", delta='{"command": "sleep 30"}')
        yield ToolInputEnd(id="call_1")
        yield ToolCall(id="call_1", name="bash", input={"command": "sleep 30"})
        await self.go.wait()
        raise RuntimeError("adapter bug")


async def test_an_unexpected_error_settles_running_tools_before_the_step_fails(
    tmp_path: Path, workdir: Path
) -> None:
    model = BrokenModel()
    config = RuntimeConfig(
        data_dir=tmp_path / "data", default_directory=str(workdir), providers={"broken": model}
    )
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        create = CreateSessionInput(model=ModelRef(provider_id="broken", id="m"))
        sid = (await rt.sessions.create(create)).id
        await rt.sessions.prompt(sid, PromptInput(text="go"))
        await feed.wait("session.tool.called", sessionID=sid)
        model.go.set()
        failed = await feed.wait("session.execution.failed", sessionID=sid)
        assert failed["data"]["error"]["type"] == "unknown"
        assert "adapter bug" in failed["data"]["error"]["message"]
        types = feed.types(sid)
        assert types.index("session.tool.failed") < types.index("session.step.failed")
        assert types.index("session.step.failed") < types.index("session.execution.failed")
        assert await rt.store.queries.open_tool_calls(sid) == []
        messages = (await rt.sessions.messages(sid, order="asc", limit=200)).data
        (reply,) = [m for m in messages if isinstance(m, AssistantMessage)]
        (tool,) = reply.parts
        assert isinstance(tool, ToolPart)
        assert tool.status == "error"


CHILD = """
import asyncio, sys
from pathlib import Path
from actors.llm import ModelLimits, ProviderConfig
from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ModelRef

async def main(data_dir, workdir, url):
    provider = ProviderConfig(
        id="oa", kind="openai", base_url=url, api_key_env="ATTEMPTS_TEST_KEY",
        models={"gpt-fake": ModelLimits(context=100000, output=1000)},
    )
    config = RuntimeConfig(
        data_dir=Path(data_dir), default_directory=workdir, provider_configs={"oa": provider},
        retry_base_delay_s=3600,
    )
    async with Runtime(config) as rt:
        scheduled = asyncio.get_running_loop().create_future()
        def seen(message):
            if message["type"] == "session.retry.scheduled" and not scheduled.done():
                scheduled.set_result(message["data"]["sessionID"])
        rt.bus.subscribe(seen)
        model = ModelRef(provider_id="oa", id="gpt-fake")
        session = await rt.sessions.create(CreateSessionInput(model=model))
        await rt.sessions.prompt(session.id, PromptInput(text="go"))
        # Printed once retry.scheduled has committed: the crash comes mid-backoff.
        print(await scheduled, flush=True)
        await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.sqlite_only  # its crashing child process opens the data dir's SQLite
async def test_a_crash_during_the_backoff_is_recovered(tmp_path: Path, workdir: Path) -> None:
    async with FakeProvider() as fake:
        fake.replies.append(openai_error(503, "unavailable", type="server_error"))
        config = runtime_config(tmp_path, workdir, fake)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(config.data_dir),
            str(workdir),
            fake.openai_url,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(60):
                sid = (await proc.stdout.readline()).decode().strip()
            assert sid, "the child exited before scheduling its retry"
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        fake.replies.append(Reply.stream(openai_text(["recovered"])))
        async with Runtime(config) as rt:
            assert rt.recovery.resumed == (sid,)
            await rt.execution.wait_idle(sid)
            session = await rt.sessions.get(sid)
            assert session.retry is None
            messages = (await rt.sessions.messages(sid, order="asc", limit=200)).data
            # The crash cut the step off mid-backoff, before any output: it
            # left no record, and the resumed drain answers in one message.
            (last,) = [m for m in messages if isinstance(m, AssistantMessage)]
            assert last.parts == (TextPart(ordinal=0, text="recovered"),)
            assert last.error is None
            assert await rt.store.queries.claims() == []
            types = [r.type for r in await rt.store.read(sid, limit=1000)]
            assert types[-1] == "session.execution.succeeded.1"
            assert "session.retry.scheduled.1" in types
            await replay_matches(rt)
        assert len(fake.received) == 2
