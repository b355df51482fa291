"""Tool calls on pooled call actors: owned, reporting, stopped with their owner, joined at close.

Real pykka threads throughout; the tools are test functions that block on
threading events the way a real tool blocks on I/O.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pykka
import pytest
from loop_turns import quiesce
from proc_groups import alive

from actors import BlockingExecutor
from actors.tools import (
    Cancel,
    CancelEvent,
    OutputBounding,
    Progress,
    ToolActors,
    ToolCallActor,
    ToolChild,
    ToolContext,
    ToolError,
    ToolExecutor,
    ToolOutcome,
    ToolOwner,
    ToolRegistry,
    ToolResult,
)
from actors.tools.builtin import BashTool, GrepTool

GUARD = 10.0


class FnTool:
    description = "a test tool"
    input_schema: Mapping[str, Any] = {"type": "object"}

    def __init__(self, name: str, fn: Callable[[Mapping[str, Any], ToolContext], ToolResult]):
        self.name = name
        self._fn = fn

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        return self._fn(input, ctx)


def executor_for(runner: ToolActors, bounding: OutputBounding, *tools: FnTool) -> ToolExecutor:
    return ToolExecutor(ToolRegistry(tools), runner, bounding)


async def test_calls_run_off_the_loop_on_a_reused_call_actors_worker(
    runner: ToolActors, bounding: OutputBounding, make_ctx: Callable[..., ToolContext]
) -> None:
    seen: list[tuple[threading.Thread, int]] = []

    def where(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        seen.append(
            (threading.current_thread(), len(pykka.ActorRegistry.get_by_class(ToolCallActor)))
        )
        return ToolResult.text("ok")

    executor = executor_for(runner, bounding, FnTool("t", where))
    owner = ToolOwner()
    for n in range(2):
        outcome = await executor.execute("t", {}, make_ctx(call_id=f"c{n}"), owner=owner)
        assert outcome.status == "success"
    (first, live_first), (second, live_second) = seen
    # One after the other: the second call reused the first one's actor and worker.
    assert first is second
    assert first is not threading.main_thread()
    assert live_first == live_second == 1
    assert runner.started == 1
    assert first.is_alive()  # idle between calls, joined when the pool closes
    assert owner.children == ()
    assert runner.running == 0


async def test_an_escaping_exception_is_logged_and_settles_only_its_call(
    runner: ToolActors,
    bounding: OutputBounding,
    make_ctx: Callable[..., ToolContext],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def crash(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        raise LookupError("no such row")

    executor = executor_for(runner, bounding, FnTool("t", crash), FnTool("ok", _ok))
    with caplog.at_level(logging.ERROR, logger="actors.tools._actors"):
        outcome = await executor.execute("t", {}, make_ctx(call_id="c1"))
    assert outcome.error == {"type": "tool.error", "message": "LookupError: no such row"}
    assert any("tool call c1 raised" in r.getMessage() for r in caplog.records)
    # The actor and its worker live on: the next call runs on them.
    [ref] = pykka.ActorRegistry.get_by_class(ToolCallActor)
    assert (await executor.execute("ok", {}, make_ctx(call_id="c2"))).status == "success"
    assert pykka.ActorRegistry.get_by_class(ToolCallActor) == [ref]
    assert runner.started == 1


async def test_a_base_exception_fails_only_its_own_call(
    runner: ToolActors, bounding: OutputBounding, make_ctx: Callable[..., ToolContext]
) -> None:
    def exits(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        raise SystemExit(3)

    executor = executor_for(runner, bounding, FnTool("exit", exits), FnTool("ok", _ok))
    outcome = await executor.execute("exit", {}, make_ctx())
    assert outcome.error is not None
    assert outcome.error["type"] == "tool.error"
    assert "SystemExit" in outcome.error["message"]
    # pykka would stop every actor on a SystemExit: the pool still works.
    assert (await executor.execute("ok", {}, make_ctx())).status == "success"


def _ok(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
    return ToolResult.text("ok")


async def test_progress_comes_back_to_the_owner_as_messages_on_the_loop(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    received: list[tuple[Progress, threading.Thread]] = []

    def chatty(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        for n in range(3):
            ctx.progress({"n": n})
        return ToolResult.text("done")

    owner = ToolOwner(on_progress=lambda p: received.append((p, threading.current_thread())))
    executor = executor_for(runner, bounding, FnTool("t", chatty))
    outcome = await executor.execute("t", {}, ctx, owner=owner)
    assert outcome.status == "success"
    await asyncio.sleep(0)  # progress hops are queued before the outcome's, all on the loop
    assert [p for p, _ in received] == [
        Progress(call_id=ctx.call_id, metadata={"n": n}) for n in range(3)
    ]
    assert {t for _, t in received} == {threading.current_thread()}


async def test_stopping_the_owner_stops_every_child_and_waits_for_each(
    runner: ToolActors, bounding: OutputBounding, make_ctx: Callable[..., ToolContext]
) -> None:
    loop = asyncio.get_running_loop()
    started: asyncio.Queue[str] = asyncio.Queue()
    returned: list[str] = []

    def waits(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        loop.call_soon_threadsafe(started.put_nowait, ctx.call_id)
        try:
            if not ctx.cancel.wait(GUARD):
                return ToolResult.text("never cancelled")
            raise ToolError("stopped by its owner", type="aborted")
        finally:
            returned.append(ctx.call_id)

    owner = ToolOwner()
    executor = executor_for(runner, bounding, FnTool("t", waits))
    calls = [
        asyncio.create_task(executor.execute("t", {}, make_ctx(call_id=f"c{n}"), owner=owner))
        for n in range(3)
    ]
    async with asyncio.timeout(GUARD):
        for _ in calls:
            await started.get()
    assert len(owner.children) == 3
    assert len(pykka.ActorRegistry.get_by_class(ToolCallActor)) == 3
    await owner.stop()
    # stop() returned only after every child reported: each tool has returned.
    assert sorted(returned) == ["c0", "c1", "c2"]
    outcomes = await asyncio.gather(*calls)
    assert [o.error for o in outcomes] == [
        {"type": "aborted", "message": "stopped by its owner"}
    ] * 3
    assert owner.children == ()
    assert runner.running == 0


async def test_someone_elses_pykka_stop_all_neither_loses_a_call_nor_the_pool(
    bounding: OutputBounding, blocking: BlockingExecutor, make_ctx: Callable[..., ToolContext]
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    ran: list[str] = []

    def finishes_anyway(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        loop.call_soon_threadsafe(started.set)
        # The actor hears the stop while this runs, and cancels the call.
        ran.append("stop heard" if ctx.cancel.wait(GUARD) else "never stopped")
        return ToolResult.text("first")

    def second(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        ran.append("second")
        return ToolResult.text("second")

    async with ToolActors(blocking=blocking, limit=2) as runner:
        executor = executor_for(
            runner, bounding, FnTool("block", finishes_anyway), FnTool("t", second)
        )
        first = asyncio.create_task(executor.execute("block", {}, make_ctx(call_id="c1")))
        async with asyncio.timeout(GUARD):
            await started.wait()
        # Someone else's pykka shutdown: the busy child stops its tool and waits for it.
        _ = pykka.ActorRegistry.stop_all(block=False)
        outcome = await first
        # The tool finished its work regardless: its success stands.
        assert outcome.status == "success"
        # The pool was not stopped with them: later calls still run.
        assert (await executor.execute("t", {}, make_ctx(call_id="c2"))).status == "success"
    assert ran == ["stop heard", "second"]


async def test_closing_the_pool_cancels_running_children_and_waits(
    bounding: OutputBounding, blocking: BlockingExecutor, ctx: ToolContext
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def waits(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        loop.call_soon_threadsafe(started.set)
        if not ctx.cancel.wait(GUARD):
            return ToolResult.text("never cancelled")
        raise ToolError("closed", type="aborted")

    runner = ToolActors(blocking=blocking, limit=1)
    async with runner:
        call = asyncio.create_task(
            executor_for(runner, bounding, FnTool("t", waits)).execute("t", {}, ctx)
        )
        async with asyncio.timeout(GUARD):
            await started.wait()
    assert runner.running == 0
    outcome = await call
    assert outcome.error == {"type": "aborted", "message": "closed"}
    assert pykka.ActorRegistry.get_all() == []


async def test_lifecycle_errors(
    bounding: OutputBounding, blocking: BlockingExecutor, ctx: ToolContext
) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ToolActors(blocking=blocking, limit=0)
    runner = ToolActors(blocking=blocking)
    with pytest.raises(RuntimeError, match="not open"):
        await runner.run(lambda: None, call_id="c", cancel=CancelEvent())  # type: ignore[arg-type, return-value]
    async with runner:
        with pytest.raises(RuntimeError, match="opens once"):
            await runner.__aenter__()


async def test_a_cancelled_owner_stop_still_waits_for_every_child_then_raises(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    cancelled = asyncio.Event()
    release = threading.Event()
    returned = threading.Event()

    def slow_to_stop(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        loop.call_soon_threadsafe(started.set)
        ctx.cancel.wait(GUARD)
        loop.call_soon_threadsafe(cancelled.set)
        release.wait(GUARD)  # takes its time after the cancel
        returned.set()
        raise ToolError("stopped", type="aborted")

    owner = ToolOwner()
    call = asyncio.create_task(
        executor_for(runner, bounding, FnTool("t", slow_to_stop)).execute("t", {}, ctx, owner=owner)
    )
    async with asyncio.timeout(GUARD):
        await started.wait()
    stopping = asyncio.create_task(owner.stop())
    async with asyncio.timeout(GUARD):
        await cancelled.wait()  # the stop reached the child, which now takes its time
    stopping.cancel()
    await quiesce()
    assert not stopping.done()  # the cancel did not abandon the child
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert returned.is_set()
    assert (await call).error == {"type": "aborted", "message": "stopped"}


# -- the actor hears Cancel while its tool runs ------------------------------------------------


async def test_a_cancel_told_to_the_actor_reaches_the_tool_while_it_runs(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def waits(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        loop.call_soon_threadsafe(started.set)
        if not ctx.cancel.wait(GUARD):
            return ToolResult.text("never cancelled")
        raise ToolError("cancelled by my actor", type="aborted")

    owner = ToolOwner()
    call = asyncio.create_task(
        executor_for(runner, bounding, FnTool("t", waits)).execute("t", {}, ctx, owner=owner)
    )
    async with asyncio.timeout(GUARD):
        await started.wait()
    [ref] = pykka.ActorRegistry.get_by_class(ToolCallActor)
    [child] = owner.children
    # Only the message: nobody on the loop touches the call's cancel event.
    ref.tell(Cancel(child=child))
    assert (await call).error == {"type": "aborted", "message": "cancelled by my actor"}


async def test_cancel_ends_the_process_group_of_a_running_bash_call(
    runner: ToolActors, bounding: OutputBounding, location: Path, ctx: ToolContext
) -> None:
    up = asyncio.Event()

    def on_progress(message: Progress) -> None:
        if "up" in message.metadata["output"]:
            up.set()

    owner = ToolOwner(on_progress=on_progress)
    executor = ToolExecutor(ToolRegistry([BashTool()]), runner, bounding)
    command = "echo $$ > leader.pid; sleep 30 & echo $! > bg.pid; echo up; wait"
    call = asyncio.create_task(
        executor.execute("bash", {"command": command, "timeout_s": 60}, ctx, owner=owner)
    )
    async with asyncio.timeout(GUARD):
        await up.wait()
    leader, background = (int((location / f).read_text()) for f in ("leader.pid", "bg.pid"))
    assert alive(leader)
    assert alive(background)
    await owner.stop()
    outcome = await call
    assert outcome.error is not None
    assert outcome.error["type"] == "aborted"
    assert not alive(leader)
    assert not alive(background)
    assert runner.running == 0


async def test_cancel_ends_the_file_loop_of_a_running_grep(
    runner: ToolActors, bounding: OutputBounding, location: Path, ctx: ToolContext
) -> None:
    for n in range(20):
        (location / f"f{n}.txt").write_text("needle\nhay\n" * 50)
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    grep = GrepTool()

    def greps_until_stopped(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        """Runs grep over the tree again and again: only grep's own loop checks the cancel."""
        loop.call_soon_threadsafe(started.set)
        deadline = time.monotonic() + GUARD  # a guard, not a timing
        while time.monotonic() < deadline:
            grep.run({"pattern": "needle"}, ctx)  # raises ToolError(aborted) once cancelled
        return ToolResult.text("grep never stopped")

    owner = ToolOwner()
    executor = executor_for(runner, bounding, FnTool("loop", greps_until_stopped))
    call = asyncio.create_task(executor.execute("loop", {}, ctx, owner=owner))
    async with asyncio.timeout(GUARD):
        await started.wait()
    await owner.stop()
    assert (await call).error == {"type": "aborted", "message": "Tool execution aborted"}


async def test_closing_the_pool_ends_every_thread_it_started(
    bounding: OutputBounding, blocking: BlockingExecutor, make_ctx: Callable[..., ToolContext]
) -> None:
    def ours() -> set[threading.Thread]:
        # The blocking executor's threads live on until it closes: not the pool's.
        return {t for t in threading.enumerate() if not t.name.startswith("sessionrt-blocking")}

    before = ours()
    async with ToolActors(blocking=blocking, limit=2) as runner:
        executor = executor_for(runner, bounding, FnTool("t", _ok))
        outcomes = await asyncio.gather(
            *(executor.execute("t", {}, make_ctx(call_id=f"c{n}")) for n in range(4))
        )
        assert {o.status for o in outcomes} == {"success"}
    # Joined, not awaited by polling: the spawner joined each child's thread, and
    # its own thread was joined on the blocking executor before aclose returned.
    # Only threads that are new count: one an earlier test left (asyncio's
    # waitpid watcher) may end meanwhile, which is not the pool's doing.
    assert ours() - before == set()


# -- the pool: reused actors, bounded by count, joined at close --------------------------------


class _Recording(ToolOwner):
    """An owner that remembers every call it adopted."""

    def __init__(self) -> None:
        super().__init__()
        self.adopted: list[ToolChild] = []

    def adopt(self, child: ToolChild) -> None:
        super().adopt(child)
        self.adopted.append(child)


def _outcome(text: str) -> ToolOutcome:
    return ToolOutcome.success(ToolResult.text(text))


async def test_a_reused_actor_hears_cancel_for_its_current_call_only(
    bounding: OutputBounding, blocking: BlockingExecutor
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    # One event for both calls: only the actor's own rule keeps a stale Cancel off the second.
    shared = CancelEvent()
    owner = _Recording()

    def waits() -> ToolOutcome:
        loop.call_soon_threadsafe(started.set)
        if not shared.wait(GUARD):
            return _outcome("never cancelled")
        return ToolOutcome.failure("aborted", "cancelled")

    async with ToolActors(blocking=blocking, limit=1) as runner:
        first = await runner.run(lambda: _outcome("one"), call_id="c1", cancel=shared, owner=owner)
        assert first.status == "success"
        second = asyncio.create_task(runner.run(waits, call_id="c2", cancel=shared, owner=owner))
        async with asyncio.timeout(GUARD):
            await started.wait()
        [ref] = pykka.ActorRegistry.get_by_class(ToolCallActor)
        old, current = owner.adopted
        # A late Cancel for the earlier call, then a round trip through the same mailbox.
        await blocking.run(lambda: ref.ask(Cancel(child=old)))
        assert not shared.is_set()
        assert not second.done()
        ref.tell(Cancel(child=current))
        assert (await second).error == {"type": "aborted", "message": "cancelled"}
        assert runner.started == 1


async def test_the_pool_is_bounded_by_count_and_reuses_its_actors(
    bounding: OutputBounding, blocking: BlockingExecutor
) -> None:
    loop = asyncio.get_running_loop()
    started: asyncio.Queue[str] = asyncio.Queue()
    release = threading.Event()

    def waits(name: str) -> Callable[[], ToolOutcome]:
        def work() -> ToolOutcome:
            loop.call_soon_threadsafe(started.put_nowait, name)
            release.wait(GUARD)
            return _outcome(name)

        return work

    async with ToolActors(blocking=blocking, limit=2) as runner:
        calls = [
            asyncio.create_task(runner.run(waits(f"c{n}"), call_id=f"c{n}", cancel=CancelEvent()))
            for n in range(5)
        ]
        async with asyncio.timeout(GUARD):
            await started.get()
            await started.get()
        await quiesce()
        # Two at once, on two actors; the other three wait for a slot, starting nothing.
        assert started.empty()
        assert runner.running == 2
        assert runner.actors == runner.started == 2
        assert len(pykka.ActorRegistry.get_by_class(ToolCallActor)) == 2
        release.set()
        outcomes = await asyncio.gather(*calls)
        assert [o.status for o in outcomes] == ["success"] * 5
        # Five calls, still two actors.
        assert runner.actors == runner.started == 2


async def test_closing_the_pool_joins_every_actor_and_worker_thread(
    bounding: OutputBounding, blocking: BlockingExecutor
) -> None:
    loop = asyncio.get_running_loop()
    workers: set[threading.Thread] = set()
    both = asyncio.Event()
    release = threading.Event()

    def work() -> ToolOutcome:
        workers.add(threading.current_thread())
        if len(workers) == 2:
            loop.call_soon_threadsafe(both.set)
        release.wait(GUARD)
        return _outcome("ok")

    before = set(threading.enumerate())
    async with ToolActors(blocking=blocking, limit=3) as runner:
        calls = [
            asyncio.create_task(runner.run(work, call_id=f"c{n}", cancel=CancelEvent()))
            for n in range(2)
        ]
        async with asyncio.timeout(GUARD):
            await both.wait()
        release.set()
        await asyncio.gather(*calls)
        pool_threads = {
            t for t in set(threading.enumerate()) - before if not t.name.startswith("sessionrt-")
        }
        # Two actors, each its own thread and its worker's, idle now.
        assert workers <= pool_threads
        assert len(pool_threads) == 4
    assert not any(t.is_alive() for t in pool_threads)
    assert pykka.ActorRegistry.get_all() == []


async def test_an_actor_stopped_while_idle_is_replaced_and_its_threads_end(
    bounding: OutputBounding, blocking: BlockingExecutor
) -> None:
    threads: list[threading.Thread] = []

    def where() -> ToolOutcome:
        threads.append(threading.current_thread())
        return _outcome("ok")

    async with ToolActors(blocking=blocking, limit=1) as runner:
        assert (await runner.run(where, call_id="c1", cancel=CancelEvent())).status == "success"
        # Someone else's pykka shutdown while the actor is idle.
        stops = pykka.ActorRegistry.stop_all(block=False)
        await blocking.run(lambda: [f.get(timeout=GUARD) for f in stops])
        first_worker = threads[0]
        assert not first_worker.is_alive()  # the actor joined its worker as it stopped
        # The pool notices, and the next call runs on a new actor.
        assert (await runner.run(where, call_id="c2", cancel=CancelEvent())).status == "success"
        assert threads[1] is not first_worker
        assert runner.started == 2
        assert len(pykka.ActorRegistry.get_by_class(ToolCallActor)) == 1
        assert runner.actors <= 2  # the stopped one is kept only while its thread still ends
    assert pykka.ActorRegistry.get_all() == []
    assert not any(t.is_alive() for t in threads)
