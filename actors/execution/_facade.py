"""Execution: the facade the rest of the runtime calls (SessionExecution)."""

from __future__ import annotations

import asyncio

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
from actors.kit import ActorRef
from protocol.events import InterruptReason


class Execution:
    """SessionExecution: the process-local execution API keyed by session id.

    A request travels with its own reply future. The ``ask`` only confirms the
    supervisor took the message (and raises ``ActorDeadError`` if it is gone);
    the answer arrives in the message's future, from the supervisor's books or
    from the session actor it forwarded the request to.
    """

    def __init__(self, supervisor: ActorRef[Supervisor]) -> None:
        self._supervisor = supervisor

    @classmethod
    async def start(cls, hooks: ExecutionHooks) -> Execution:
        return cls(await Supervisor.start(hooks))

    def wake(self, session_id: str, scope: Scope = "input") -> None:
        """Ring the session's doorbell; never blocks, never fails for the caller."""
        if self._supervisor.is_alive():
            self._supervisor.tell(Wake(session_id=session_id, scope=scope))

    async def resume(self, session_id: str) -> Terminal:
        """Start or join the session's execution and return its terminal.

        Each caller has its own reply: one that gives up cancels only its own.
        """
        reply: asyncio.Future[Terminal] = asyncio.get_running_loop().create_future()
        await self._supervisor.ask(Resume(session_id=session_id, reply=reply))
        return await reply

    async def interrupt(self, session_id: str, reason: InterruptReason = "user") -> bool:
        reply: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        await self._supervisor.ask(Interrupt(session_id=session_id, reason=reason, reply=reply))
        return await reply

    def lease_lost(self, session_id: str) -> None:
        """This host lost the session's lease: stop its busy period, writing nothing more."""
        if self._supervisor.is_alive():
            self._supervisor.tell(LeaseLost(session_id=session_id))

    async def wait_idle(self, session_id: str) -> None:
        """Return once the session has no busy period (successors included)."""
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._supervisor.ask(AwaitIdle(session_id=session_id, reply=reply))
        await reply

    async def active(self) -> list[str]:
        """Sessions with a busy period owned by this process."""
        result: list[str] = await self._supervisor.ask(Active())
        return result

    async def shutdown(self) -> None:
        """Interrupt every busy period with reason ``shutdown`` (claims stay), wait, stop."""
        if not self._supervisor.is_alive():
            return
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._supervisor.ask(Shutdown(reply=reply))
        await reply
        await self._supervisor.stop()
