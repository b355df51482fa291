"""Step allowance, claims through shutdown, and output bounding through the runtime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path

from feed import Feed

from actors.llm import (
    Finish,
    ModelRequest,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
    ToolCall,
    is_max_steps_message,
)
from actors.runtime import Runtime, RuntimeConfig
from protocol import AssistantMessage, ModelRef
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ToolPart


class Stubborn:
    """A provider that calls a tool every time, even when told not to."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        self.requests.append(request)
        yield TextStart(ordinal=0)
        yield TextChunk(ordinal=0, delta="again")
        yield TextEnd(ordinal=0)
        yield ToolCall(id=f"call_{len(self.requests)}", name="list", input={})
        yield Finish(reason="tool-calls")


async def test_the_step_allowance_ends_the_loop_with_tools_disabled(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_text("[agents.build]\nsteps = 3\n")
    stubborn = Stubborn()
    config = RuntimeConfig(
        data_dir=data, default_directory=str(tmp_path), providers={"stub": stubborn}
    )
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(
            CreateSessionInput(model=ModelRef(id="stub-1", provider_id="stub"))
        )
        await rt.sessions.prompt(s.id, PromptInput(text="loop forever"))
        await feed.wait("session.execution.succeeded", sessionID=s.id)
        assistants = [
            m
            for m in (await rt.sessions.messages(s.id, order="asc")).data
            if isinstance(m, AssistantMessage)
        ]
    assert len(assistants) == 3  # steps 1, 2 and the last allowed one; no continuation
    assert [r.tool_choice for r in stubborn.requests] == ["auto", "auto", "none"]
    assert is_max_steps_message(stubborn.requests[-1].messages[-1])
    assert stubborn.requests[-1].tools  # kept for the prompt cache
    last_tool = assistants[-1].parts[-1]
    assert isinstance(last_tool, ToolPart)
    assert last_tool.status == "error"
    assert last_tool.error == {
        "type": "tool.disabled",
        "message": "Tools are disabled after the maximum agent steps",
    }


async def test_new_input_resets_the_allowance(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_text("[agents.build]\nsteps = 2\n")
    stubborn = Stubborn()
    config = RuntimeConfig(
        data_dir=data, default_directory=str(tmp_path), providers={"stub": stubborn}
    )
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(
            CreateSessionInput(model=ModelRef(id="stub-1", provider_id="stub"))
        )
        await rt.sessions.prompt(s.id, PromptInput(text="one", resume=False))
        await rt.execution.resume(s.id)
        await rt.sessions.prompt(s.id, PromptInput(text="two", resume=False))
        await rt.execution.resume(s.id)
    assert [r.tool_choice for r in stubborn.requests] == ["auto", "none", "auto", "none"]


async def test_a_shutdown_interrupt_keeps_the_claim(tmp_path: Path) -> None:
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create()
        await rt.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "sleep 30"}'))
        await feed.wait("session.tool.called", sessionID=s.id)
        claims = await rt.store.queries.claims()
        assert [c.session_id for c in claims] == [s.id]
    # Closing the runtime interrupted it with reason shutdown.
    assert feed.events[-1]["type"] == "session.execution.interrupted"
    assert feed.events[-1]["data"]["reason"] == "shutdown"
    async with Runtime(config) as again:
        assert [c.session_id for c in await again.store.queries.claims()] == [s.id]


async def test_large_tool_output_is_bounded_with_a_managed_file(
    runtime: Runtime, feed: Feed
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(
        s.id, PromptInput(text='#tool bash {"command": "seq 1 5000"}\n#step\n#text done')
    )
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    success = next(m for m in feed.events if m["type"] == "session.tool.success")
    metadata = success["data"]["metadata"]
    assert metadata["truncated"] is True
    full = await asyncio.to_thread(Path(metadata["outputPath"]).read_text)
    assert full.splitlines()[-1] == "5000"
    preview = "\n".join(c["text"] for c in success["data"]["content"] if c["type"] == "text")
    assert "truncated; full content saved to" in preview
    assert len(preview.splitlines()) <= 2_001 + 1


class Steered(Stubborn):
    """Calls a tool every time; during its first step two steers arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.steer: Callable[[], Awaitable[None]] | None = None

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        if not self.requests and self.steer is not None:
            await self.steer()
        async for part in super().stream(request):
            yield part


async def test_a_batch_of_steers_resets_the_allowance_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_text("[agents.build]\nsteps = 3\n")
    steered = Steered()
    config = RuntimeConfig(
        data_dir=data, default_directory=str(tmp_path), providers={"stub": steered}
    )
    async with Runtime(config) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create(
            CreateSessionInput(model=ModelRef(id="stub-1", provider_id="stub"))
        )

        async def steer() -> None:
            for text in ("steer a", "steer b"):
                await rt.sessions.prompt(s.id, PromptInput(text=text, resume=False))

        steered.steer = steer
        await rt.sessions.prompt(s.id, PromptInput(text="loop"))
        await feed.wait("session.execution.succeeded", sessionID=s.id)
    # Both steers land at the boundary after step 1, in one batch: the count
    # starts again once (1, 2, 3 with tools off), not once per steer.
    second = steered.requests[1].messages
    assert [m.text for m in second[-2:]] == ["steer a", "steer b"]
    assert [r.metadata["step"] for r in steered.requests] == [1, 1, 2, 3]
    assert [r.tool_choice for r in steered.requests] == ["auto", "auto", "auto", "none"]
