"""The clock what waits on time reads: the wall clock in milliseconds, sleeping, and deadlines.

Everything that waits on time takes a :class:`Clock` (the runtime's is
``RuntimeConfig.clock``, handed to each part by ``actors.services.build_services``);
the default is :data:`SYSTEM`. It drives lease expiry and renewal, the retry
backoff, the tool-output retention sweep, the wait for another host's answer to
an interrupt, and the streams' heartbeats. Tests give their runtime a clock they
advance instead of sleeping, so a lease expires, a retry fires or a heartbeat
goes out because the test said so, not because real time ran out on a machine
that may be slower than the wait.

What is *recorded* is not this clock's business: an event's ``created`` stays
the wall clock's (:func:`storage.recorder.now_ms`). ``now_ms`` is the clock's
own reading, for what is compared with a wait (a lease's expiry, a retry's ``at``).
I/O deadlines (a write to a stalled peer, a subprocess's exit) stay on real time:
they bound what another party does, not a wait of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final, Protocol

__all__ = ["SYSTEM", "Clock", "SystemClock", "wait_event"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch. May be read from any thread."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...

    def timeout(
        self, seconds: float | None
    ) -> contextlib.AbstractAsyncContextManager[asyncio.Timeout]:
        """As :func:`asyncio.timeout`: the block is cancelled, and ``TimeoutError``
        raised, once ``seconds`` have passed on this clock (never when None). What
        it gives is an :class:`asyncio.Timeout`: ``reschedule`` may end it sooner."""
        ...


class SystemClock:
    """The real one: ``time.time_ns``, ``asyncio.sleep`` and ``asyncio.timeout``."""

    def __repr__(self) -> str:  # the configuration reference prints the default
        return "SystemClock()"

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float | None) -> asyncio.Timeout:
        return asyncio.timeout(seconds)


SYSTEM: Final[Clock] = SystemClock()


async def wait_event(clock: Clock, event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for ``event`` at most ``seconds`` on ``clock``; whether it was set."""
    try:
        async with clock.timeout(seconds):  # not wait_for (3.11 can swallow a cancel)
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
