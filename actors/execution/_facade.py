"""Execution: the facade the rest of the runtime calls (SessionExecution)."""

from __future__ import annotations

import asyncio

from actors._ref import ActorRef
from actors.execution._messages import (
    Active,
    AwaitIdle,
    ExecutionHooks,
    Interrupt,
    LeaseLost,
    Resume,
    Shutdown,
    Terminal,
    Wake,
)
from actors.execution._supervisor import Supervisor
from actors.inbox import Scope
from protocol.events import InterruptReason


class Execution:
    """SessionExecution: the process-local execution API keyed by session id."""

    def __init__(self, supervisor: ActorRef[Supervisor]) -> None:
        self._supervisor = supervisor

    @classmethod
    async def start(cls, hooks: ExecutionHooks) -> Execution:
        return cls(await Supervisor.start(hooks))

    def wake(self, session_id: str, scope: Scope = "input") -> None:
        """Ring the session's doorbell; never blocks, never fails for the caller."""
        if self._supervisor.is_alive():
            self._supervisor.tell(Wake(session_id, scope))

    async def resume(self, session_id: str) -> Terminal:
        """Start or join the session's execution and return its terminal."""
        # The supervisor answers with the session actor's answer to come, whose
        # own answer is the terminal's future.
        answer: asyncio.Future[asyncio.Future[Terminal]] = await self._supervisor.ask(
            Resume(session_id)
        )
        future = await answer
        # Shielded: a joined waiter that gives up must not cancel the terminal
        # every other waiter is waiting for.
        return await asyncio.shield(future)

    async def interrupt(self, session_id: str, reason: InterruptReason = "user") -> bool:
        answer: asyncio.Future[bool] = await self._supervisor.ask(Interrupt(session_id, reason))
        return await answer

    def lease_lost(self, session_id: str) -> None:
        """This host lost the session's lease: stop its busy period, writing nothing more."""
        if self._supervisor.is_alive():
            self._supervisor.tell(LeaseLost(session_id))

    async def wait_idle(self, session_id: str) -> None:
        """Return once the session has no busy period (successors included)."""
        while True:
            answer: asyncio.Future[asyncio.Future[None]] = await self._supervisor.ask(
                AwaitIdle(session_id)
            )
            await asyncio.shield(await answer)
            if session_id not in await self.active():
                return

    async def active(self) -> list[str]:
        """Sessions with a busy period owned by this process."""
        result: list[str] = await self._supervisor.ask(Active())
        return result

    async def shutdown(self) -> None:
        """Interrupt every busy period with reason ``shutdown`` (claims stay), wait, stop."""
        if not self._supervisor.is_alive():
            return
        waiters: list[asyncio.Future[None]] = await self._supervisor.ask(Shutdown())
        for waiter in waiters:
            await asyncio.shield(waiter)
        await self._supervisor.stop()
