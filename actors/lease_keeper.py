"""This host's execution leases: taken at start, renewed while working, released at the end.

The store does the taking, checking and releasing (:mod:`storage.lease`);
the keeper remembers the fence of each execution this host runs, renews them
all every ``ttl / 4`` (so one late renewal still leaves the lease live) and
reports a lease it failed to renew as lost: that execution must stop without
writing more, and the store would refuse it anyway.

The renewal task is the keeper's own, started and ended with it (the runtime
owns the keeper).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from storage import Command, Fence, FencedError, LeaseUse, StorageError, Store
from storage.clock import SYSTEM, Clock

__all__ = ["LeaseKeeper", "LeaseLoss"]

log = logging.getLogger(__name__)


class LeaseLoss(Protocol):
    """Who stops an execution whose lease this host failed to renew."""

    def lease_lost(self, session_id: str) -> None: ...


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        host_id: str,
        *,
        ttl_ms: int,
        on_lost: LeaseLoss,
        clock: Clock = SYSTEM,
    ) -> None:
        if ttl_ms < 40:
            raise ValueError("lease_ttl_ms must be at least 40")
        self.store = store
        self.host_id = host_id
        self.ttl_ms = ttl_ms
        self._on_lost = on_lost.lease_lost
        #: What the leases' expiry is measured on (the store's, in a runtime).
        self.clock = clock
        self._fences: dict[str, Fence] = {}
        self._task: asyncio.Task[None] | None = None
        self._suspended = False

    @property
    def interval_s(self) -> float:
        return self.ttl_ms / 4 / 1000

    def take(self, session_id: str) -> LeaseUse:
        return LeaseUse.take(session_id, self.host_id, self.ttl_ms)

    def hold(self, session_id: str, epoch: int) -> Fence:
        fence = self._fences[session_id] = Fence(session_id, self.host_id, epoch)
        return fence

    def fence(self, session_id: str) -> Fence | None:
        return self._fences.get(session_id)

    def drop(self, session_id: str, fence: Fence | None = None) -> None:
        """Forget the session's lease (only ``fence``'s, when given)."""
        if fence is None or self._fences.get(session_id) == fence:
            self._fences.pop(session_id, None)

    def held(self) -> dict[str, Fence]:
        return dict(self._fences)

    def suspend(self, suspended: bool = True) -> None:
        """Stop (or restart) renewing: how a paused process looks to the other hosts.

        For fault injection and tests; a suspended keeper still forgets and
        reports leases as usual.
        """
        self._suspended = suspended

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lease-renewal")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def renew(self) -> list[str]:
        """Renew every lease held now, at once; the sessions whose lease was lost."""
        fences = list(self._fences.values())
        outcomes = await asyncio.gather(
            *(self.store.append(Command(events=(), lease=f.renew(self.ttl_ms))) for f in fences),
            return_exceptions=True,
        )
        lost = []
        for fence, outcome in zip(fences, outcomes, strict=True):
            if isinstance(outcome, FencedError):
                if self._fences.get(fence.session_id) != fence:
                    # The execution ended while its renewal was in flight (its
                    # release made the renewal fail), and another may hold the
                    # session's next lease by now: that one is not lost.
                    continue
                lost.append(fence.session_id)
                self.drop(fence.session_id, fence)
                self._on_lost(fence.session_id)
            elif isinstance(outcome, StorageError):
                log.warning("renewing the lease of %s failed: %s", fence.session_id, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return lost

    async def _run(self) -> None:
        while True:
            await self.clock.sleep(self.interval_s)
            if self._suspended:
                continue
            try:
                await self.renew()
            except Exception:
                log.exception("lease renewal failed")
