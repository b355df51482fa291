"""The plain bounded executor for blocking helpers that are not tool calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from actors import ActorDeadError, ActorError, BlockingExecutor

GUARD = 10.0


@pytest.fixture
async def blocking(loop_hygiene: None) -> AsyncIterator[BlockingExecutor]:
    async with BlockingExecutor(limit=2, name="test-blocking") as b:
        yield b


async def test_run_returns_the_result_computed_on_a_pool_thread(
    blocking: BlockingExecutor,
) -> None:
    name = await blocking.run(lambda: threading.current_thread().name)
    assert name.startswith("test-blocking")


async def test_exceptions_come_back_and_base_exceptions_are_wrapped(
    blocking: BlockingExecutor,
) -> None:
    def fail() -> None:
        raise KeyError("k")

    def leave() -> None:
        raise SystemExit(1)

    with pytest.raises(KeyError):
        await blocking.run(fail)
    with pytest.raises(ActorError, match="SystemExit"):
        await blocking.run(leave)


async def test_never_more_than_limit_jobs_run_at_once(blocking: BlockingExecutor) -> None:
    lock = threading.Lock()
    active = peak = 0
    release = threading.Event()

    def job() -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        release.wait(0.05)
        with lock:
            active -= 1

    await asyncio.gather(*(blocking.run(job) for _ in range(8)))
    assert peak == blocking.limit == 2


async def test_cancelling_the_awaiter_sets_the_event_and_waits_for_the_job(
    blocking: BlockingExecutor,
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    cancel = threading.Event()
    returned = threading.Event()

    def job() -> None:
        loop.call_soon_threadsafe(started.set)
        cancel.wait(GUARD)
        returned.set()

    task = asyncio.create_task(blocking.run(job, cancel=cancel))
    async with asyncio.timeout(GUARD):
        await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancel.is_set()
    assert returned.is_set()  # nothing outlived the await


async def test_a_closed_executor_refuses_and_owns_no_thread() -> None:
    blocking = BlockingExecutor(limit=1, name="closing")
    with pytest.raises(RuntimeError, match="not open"):
        await blocking.run(lambda: None)
    async with blocking:
        await blocking.run(lambda: None)
    with pytest.raises(ActorDeadError):
        await blocking.run(lambda: None)
    assert not [t for t in threading.enumerate() if t.name.startswith("closing")]
