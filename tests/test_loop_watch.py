"""The slow-callback detector of tests/loop_watch.py (the ``slow_callbacks`` fixture)."""

from __future__ import annotations

import asyncio
import time

from loop_watch import SlowCallbacks


def _burn(cpu_s: float) -> None:
    """Hold the loop until this thread has used ``cpu_s`` more CPU."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


async def busy_on_the_loop() -> None:
    _burn(0.02)


async def test_a_callback_that_holds_the_loop_is_named() -> None:
    with SlowCallbacks(threshold_s=0.01, allowed={}, include_tests=True) as watch:
        await asyncio.get_running_loop().create_task(busy_on_the_loop())
        asyncio.get_running_loop().call_soon(_burn, 0.02)
        await asyncio.sleep(0)  # let the call_soon run
    offenders = watch.offenders()
    assert len(offenders) == 2, offenders
    assert offenders[0].startswith("task busy_on_the_loop: ")
    assert offenders[1].startswith("_burn: ")


async def test_an_allowed_callback_and_a_short_one_are_not_offenders() -> None:
    allowed = {"task busy_on_the_loop": "what this test is about"}
    with SlowCallbacks(threshold_s=0.01, allowed=allowed, include_tests=True) as watch:
        await asyncio.get_running_loop().create_task(busy_on_the_loop())
        await asyncio.get_running_loop().create_task(asyncio.sleep(0))
    assert [name for name, _, _ in watch.slow] == ["task busy_on_the_loop"]
    assert watch.offenders() == []


def test_a_loop_on_another_thread_is_not_watched() -> None:
    with SlowCallbacks(threshold_s=0.01, allowed={}, include_tests=True) as watch:
        import threading

        thread = threading.Thread(target=asyncio.run, args=(busy_on_the_loop(),))
        thread.start()
        thread.join()
    assert watch.slow == []


async def test_the_tests_own_code_is_left_out_unless_asked() -> None:
    with SlowCallbacks(threshold_s=0.01, allowed={}) as watch:
        await asyncio.get_running_loop().create_task(busy_on_the_loop())
    assert watch.slow == []
