"""storage.clock: a wait on a clock ends when that clock says so (the test's ManualClock)."""

from __future__ import annotations

import asyncio

import pytest
from manual_clock import ManualClock

from storage.clock import SYSTEM, wait_event


async def test_wait_event_ends_at_its_timeout_on_the_clock_and_not_before() -> None:
    clock = ManualClock(start_ms=0)
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_event(clock, event, 2.5))
    await clock.until_waiting(2_500)
    assert clock.advance(2_499) == 0
    assert clock.waits() == [2_500]
    assert not waiting.done()
    assert clock.advance(1) == 1
    assert await waiting is False
    assert clock.sleeping == 0  # the timeout's wait is gone with it


async def test_wait_event_returns_when_the_event_is_set_first() -> None:
    clock = ManualClock(start_ms=0)
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_event(clock, event, 60))
    await clock.until_sleeping()
    event.set()
    assert await waiting is True
    assert clock.sleeping == 0
    assert await wait_event(SYSTEM, event, 0) is True  # already set: no wait at all


async def test_an_outer_deadline_ends_an_inner_wait_that_is_not_due() -> None:
    """As the interrupt's resend pauses inside its overall deadline."""
    clock = ManualClock(start_ms=0)
    never = asyncio.get_running_loop().create_future()

    async def nested() -> None:
        async with clock.timeout(1), clock.timeout(5):
            await never

    task = asyncio.create_task(nested())
    await clock.until_sleeping(2)
    assert clock.waits() == [1_000, 5_000]
    clock.advance(1_000)
    with pytest.raises(TimeoutError):
        await task
    assert clock.sleeping == 0  # both waits gone: the inner one did not outlive its block


async def test_a_sleep_ends_at_its_due_and_a_cancelled_one_leaves_no_wait() -> None:
    clock = ManualClock(start_ms=0)
    first = asyncio.create_task(clock.sleep(0.003))  # 3 ms exactly, not 4 (float rounding)
    second = asyncio.create_task(clock.sleep(10))
    await clock.until_sleeping(2)
    assert clock.waits() == [3, 10_000]
    assert clock.advance(3) == 1
    await first
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert clock.sleeping == 0
