"""The thread bridge: pykka worker threads, awaited from the loop without blocking it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pykka
import pytest

from actors import Actor, ActorDeadError, ActorError, BlockingRunner
from actors._threaded import _Job, _Worker

# Only a guard: a job that waits on an event gives up after this, so a broken
# test fails instead of hanging a thread.
GUARD = 10.0


@pytest.fixture
async def runner() -> AsyncIterator[BlockingRunner]:
    async with BlockingRunner(limit=4) as r:
        yield r
    # Every pykka actor the runner started (spawner and workers) is stopped again.
    assert pykka.ActorRegistry.get_all() == []


def signaller(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    """A thread-side callback that resolves ``future`` on the loop."""

    def signal() -> None:
        loop.call_soon_threadsafe(future.set_result, None)

    return signal


async def test_run_returns_the_result_computed_on_a_worker_thread(
    runner: BlockingRunner,
) -> None:
    def job(a: int, b: int) -> tuple[int, str]:
        return a + b, threading.current_thread().name

    total, thread_name = await runner.run(job, 2, 3)
    assert total == 5
    # A pykka worker of ours, not the loop's thread or its default executor.
    assert thread_name.startswith("_Worker-")


async def test_run_raises_the_job_exception(runner: BlockingRunner) -> None:
    def job() -> None:
        raise ValueError("disk on fire")

    with pytest.raises(ValueError, match="disk on fire"):
        await runner.run(job)


async def test_a_base_exception_in_a_thread_is_wrapped(runner: BlockingRunner) -> None:
    def job() -> None:
        raise SystemExit(3)

    with pytest.raises(ActorError, match="SystemExit") as raised:
        await runner.run(job)
    assert isinstance(raised.value.__cause__, SystemExit)


async def test_the_worker_is_stopped_when_the_result_arrives(runner: BlockingRunner) -> None:
    def job() -> int:
        assert len(pykka.ActorRegistry.get_by_class(_Worker)) == 1
        return 1

    assert await runner.run(job) == 1
    # The worker reports from on_stop, after pykka unregistered it: no wait needed.
    assert pykka.ActorRegistry.get_by_class(_Worker) == []


async def test_cancelling_the_awaiter_cancels_the_job_and_waits_for_it(
    runner: BlockingRunner,
) -> None:
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()
    finished: list[str] = []

    def job(stop: threading.Event, on_start: Callable[[], None]) -> str:
        on_start()
        outcome = "cancelled" if stop.wait(GUARD) else "guard expired"
        # Winding down takes a while: run() must wait for it, not just for the event.
        time.sleep(0.1)
        finished.append(outcome)
        return outcome

    task = asyncio.create_task(runner.run(job, stop, signaller(loop, started), cancel=stop))
    await started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stop.is_set()
    assert finished == ["cancelled"]
    assert pykka.ActorRegistry.get_by_class(_Worker) == []


async def test_a_timeout_around_run_cancels_the_job(runner: BlockingRunner) -> None:
    stop = threading.Event()

    def job(stop: threading.Event) -> bool:
        return stop.wait(GUARD)

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await runner.run(job, stop, cancel=stop)
    assert stop.is_set()


async def test_never_more_than_limit_jobs_run_at_once(runner: BlockingRunner) -> None:
    lock = threading.Lock()
    running = 0
    peak = 0
    # Each job waits for `limit` jobs to be inside at once, so the limit is reached
    # every round (a smaller effective limit breaks the barrier) and never exceeded.
    barrier = threading.Barrier(runner.limit)

    def job() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            barrier.wait(GUARD)
        finally:
            with lock:
                running -= 1

    await asyncio.gather(*(runner.run(job) for _ in range(5 * runner.limit)))
    assert peak == runner.limit


async def test_the_loop_is_never_blocked_while_50_jobs_run() -> None:
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    # A full garbage collection is a pause of the whole process, not the loop
    # being blocked by the jobs; keep it out of this measurement.
    gc.disable()
    try:
        async with BlockingRunner() as runner:
            assert runner.limit == 16
            tick = asyncio.create_task(ticker())
            try:
                await asyncio.gather(*(runner.run(time.sleep, 0.2) for _ in range(50)))
            finally:
                done.set()
                await tick
    finally:
        gc.enable()
    # 50 jobs in waves of 16 take 4 x 0.2 s; all that time the loop kept ticking.
    assert len(gaps) > 100
    assert max(gaps) < 0.010, f"the loop stalled for {max(gaps) * 1000:.1f} ms"


async def test_aclose_cancels_running_jobs_and_waits_for_them() -> None:
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()

    def job(stop: threading.Event, on_start: Callable[[], None]) -> bool:
        on_start()
        return stop.wait(GUARD)

    async with BlockingRunner(limit=1) as runner:
        running = asyncio.create_task(runner.run(job, stop, signaller(loop, started), cancel=stop))
        await started
        queued = asyncio.create_task(runner.run(job, threading.Event(), lambda: None))
        await runner.aclose()
        assert stop.is_set()
        assert running.done()
        assert await running is True  # the job saw its event and returned normally
        with pytest.raises(ActorDeadError, match="closed"):
            await queued  # it was waiting for the only slot when the runner closed
    assert pykka.ActorRegistry.get_all() == []


async def test_lifecycle_errors() -> None:
    runner = BlockingRunner()
    with pytest.raises(RuntimeError, match="not open"):
        await runner.run(time.time)
    async with runner:
        pass
    with pytest.raises(ActorDeadError, match="closed"):
        await runner.run(time.time)
    with pytest.raises(RuntimeError, match="cannot be opened when closed"):
        await runner.__aenter__()
    await runner.aclose()  # idempotent
    with pytest.raises(ValueError, match="at least 1"):
        BlockingRunner(limit=0)


async def test_pykka_stop_all_elsewhere_does_not_break_the_runner(
    runner: BlockingRunner,
) -> None:
    # Someone else's pykka shutdown; the futures are dropped, never .get() on the loop.
    _ = pykka.ActorRegistry.stop_all(block=False)
    assert await runner.run(pow, 2, 3) == 8


async def test_a_worker_stopped_before_its_job_fails_the_job() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    job = _Job(call=lambda: 1, loop=loop, done=done)
    worker = _Worker.start(job, set())
    _ = worker.stop(block=False)  # overtakes the job told next
    with contextlib.suppress(pykka.ActorDeadError):
        worker.tell(job)
    with pytest.raises(ActorDeadError, match="before running its job"):
        await done


# --- threads talking to asyncio actors -----------------------------------------------------


@attrs.frozen(kw_only=True)
class Note:
    text: str


@attrs.frozen(kw_only=True)
class Notes:
    pass


class Notebook(Actor):
    def __init__(self) -> None:
        self.notes: list[str] = []

    async def on_receive(self, message: object) -> Any:
        match message:
            case Note(text=text):
                self.notes.append(text)
                return None
            case Notes():
                return list(self.notes)
        return await super().on_receive(message)


async def test_threads_reach_actors_through_call_soon_threadsafe(runner: BlockingRunner) -> None:
    ref = await Notebook.start()
    loop = asyncio.get_running_loop()

    with pytest.raises(RuntimeError, match="call_soon_threadsafe"):
        await runner.run(ref.tell, Note(text="direct"))

    def from_thread() -> None:
        loop.call_soon_threadsafe(ref.tell, Note(text="hopped"))

    await runner.run(from_thread)
    # The hop was scheduled before the job's outcome, so it has run by now.
    assert await ref.ask(Notes()) == ["hopped"]
    await ref.stop()
