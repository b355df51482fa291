"""A :class:`storage.clock.Clock` that moves only when a test advances it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable

import attrs


@attrs.define(eq=False)
class _Wait:
    #: When it ends, in the clock's milliseconds.
    due: int
    #: Ends it (a sleep returns, a timeout expires) at the loop's next turn.
    end: Callable[[], None]
    fired: bool = False


class ManualClock:
    """``now_ms`` starts at the wall clock's and stays there until :meth:`advance`;
    a ``sleep`` returns, and a ``timeout`` expires, once the clock has been advanced
    to its end. Both are waits on the clock (:attr:`sleeping`, :meth:`waits`)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = time.time_ns() // 1_000_000 if start_ms is None else start_ms
        #: Every sleep and armed timeout, in the order they began.
        self._waits: list[_Wait] = []
        #: Told whenever a wait begins (see :meth:`until`).
        self._watchers: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def now_ms(self) -> int:
        return self._now

    def _begin(self, seconds: float, end: Callable[[], None]) -> _Wait:
        # Less a nanosecond: a delay of N ms handed over as N / 1000 s ends at N ms.
        wait = _Wait(self._now + math.ceil(seconds * 1000 - 1e-6), end)
        self._waits.append(wait)
        for ready, told in self._watchers:
            if not told.done() and ready():
                told.set_result(None)
        return wait

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake = asyncio.get_running_loop().create_future()
        wait = self._begin(seconds, lambda: wake.set_result(None))
        try:
            await wake
        finally:
            self._waits.remove(wait)

    @contextlib.asynccontextmanager
    async def timeout(self, seconds: float | None) -> AsyncIterator[asyncio.Timeout]:
        async with asyncio.timeout(None) as deadline:
            if seconds is None:
                yield deadline
                return
            loop = asyncio.get_running_loop()
            if seconds <= 0:
                deadline.reschedule(loop.time())
                yield deadline
                return
            wait = self._begin(seconds, lambda: deadline.reschedule(loop.time()))
            try:
                yield deadline
            finally:
                self._waits.remove(wait)

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` on and end the sleeps and timeouts due by then; how
        many. What they ended runs at the loop's next turn, not inside this call."""
        self._now += ms
        ended = 0
        for wait in list(self._waits):
            if wait.due <= self._now and not wait.fired:
                wait.fired = True
                wait.end()
                ended += 1
        return ended

    @property
    def sleeping(self) -> int:
        """How many sleeps and timeouts are waiting on this clock (not yet ended)."""
        return sum(not w.fired for w in self._waits)

    def waits(self) -> list[int]:
        """When the sleeps and timeouts not yet ended end, in the clock's ms, sorted."""
        return sorted(w.due for w in self._waits if not w.fired)

    @property
    def next_due_ms(self) -> int | None:
        """How far ahead the earliest sleep or timeout ends (None: nothing waits)."""
        dues = self.waits()
        return dues[0] - self._now if dues else None

    async def until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` holds; it is asked again each time a wait begins."""
        if ready():
            return
        entry = (ready, asyncio.get_running_loop().create_future())
        self._watchers.append(entry)
        try:
            await entry[1]
        finally:
            self._watchers.remove(entry)

    async def until_sleeping(self, count: int = 1) -> None:
        """Return once ``count`` sleeps or timeouts are waiting on this clock."""
        await self.until(lambda: self.sleeping >= count)

    async def until_waiting(self, due_ms: int) -> None:
        """Return once a sleep or timeout waits to end at ``due_ms`` (the clock's ms)."""
        await self.until(lambda: due_ms in self.waits())
