"""A :class:`storage.clock.Clock` that moves only when a test advances it."""

from __future__ import annotations

import asyncio
import math
import time


class ManualClock:
    """``now_ms`` starts at the wall clock's and stays there until :meth:`advance`;
    a ``sleep`` returns once the clock has been advanced past its end."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = time.time_ns() // 1_000_000 if start_ms is None else start_ms
        self._sleepers: list[tuple[int, asyncio.Future[None]]] = []
        self._asleep: list[tuple[int, asyncio.Future[None]]] = []

    def now_ms(self) -> int:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake = asyncio.get_running_loop().create_future()
        entry = (self._now + math.ceil(seconds * 1000), wake)
        self._sleepers.append(entry)
        for count, told in self._asleep:
            if len(self._sleepers) >= count and not told.done():
                told.set_result(None)
        try:
            await wake
        finally:
            self._sleepers.remove(entry)

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` on and wake the sleeps that have ended by then; how many."""
        self._now += ms
        woken = 0
        for due, wake in self._sleepers:
            if due <= self._now and not wake.done():
                wake.set_result(None)
                woken += 1
        return woken

    @property
    def sleeping(self) -> int:
        """How many sleeps are waiting on this clock."""
        return len(self._sleepers)

    async def until_sleeping(self, count: int = 1) -> None:
        """Return once ``count`` sleeps are waiting on this clock."""
        if len(self._sleepers) >= count:
            return
        entry = (count, asyncio.get_running_loop().create_future())
        self._asleep.append(entry)
        try:
            await entry[1]
        finally:
            self._asleep.remove(entry)
