"""The clock what waits on time reads: the wall clock in milliseconds, and sleeping.

Lease expiry (the SQLite writer's), lease renewal (:class:`actors.lease_keeper.LeaseKeeper`)
take a :class:`Clock`; the default is :data:`SYSTEM`. Tests give them a clock they
advance instead of sleeping, so a lease expires because the test said so, not
because a real TTL ran out on a machine that may be slower than the TTL.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final, Protocol

__all__ = ["SYSTEM", "Clock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch. May be read from any thread."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The real one: ``time.time_ns`` and ``asyncio.sleep``."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM: Final[Clock] = SystemClock()
