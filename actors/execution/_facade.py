"""Execution: the facade the rest of the runtime calls (SessionExecution)."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.execution._messages import (
    Active,
    AwaitIdle,
    Children,
    ExecutionHooks,
    Interrupt,
    LeaseLost,
    NoHooks,
    Resume,
    SessionCommand,
    Shutdown,
    Terminal,
    Wake,
)
from actors.execution._supervisor import SessionActors, Supervisor
from actors.inbox import Run, Scope
from actors.kit import ActorDeadError, ActorRef
from protocol.errors import ServiceUnavailableError
from protocol.events import InterruptReason


class Execution:
    """SessionExecution: the process-local execution API keyed by session id.

    A request travels with its own reply future. The ``ask`` only confirms the
    supervisor took the message (and raises ``ActorDeadError`` if it is gone);
    the answer arrives in the message's future, from the supervisor's books or
    from the session actor it forwarded the request to. A command goes to the
    session actor directly, through the supervisor's directory of them.
    """

    def __init__(self) -> None:
        #: The supervisor while open (:meth:`open` to :meth:`shutdown`).
        self._ref: ActorRef[Supervisor] | None = None
        self._children: SessionActors | None = None

    @classmethod
    async def start(cls, hooks: ExecutionHooks) -> Execution:
        execution = cls()
        await execution.open(hooks)
        return execution

    async def open(self, hooks: ExecutionHooks) -> None:
        """Start the supervisor: from now on commands are run and wakes start busy periods."""
        if self._ref is not None:
            raise RuntimeError("execution opens once")
        self._ref = await Supervisor.start(hooks)
        self._children = await self._ref.ask(Children())

    @property
    def _supervisor(self) -> ActorRef[Supervisor]:
        if self._ref is None:
            raise ServiceUnavailableError("the runtime is not running", service="execution")
        return self._ref

    async def command(self, session_id: str, run: Run, *, keeps_inbox: bool = False) -> Any:
        """Have the session's actor run ``run`` as its only writer; its result or exception.

        One message to the session actor (made now if the session has none),
        which answers in the message's own future. A caller that gives up
        before the actor reaches it withdraws the command.
        """
        if self._children is None or self._ref is None or not self._ref.is_alive():
            raise ServiceUnavailableError("the runtime is not running", service="execution")
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        message = SessionCommand(
            session_id=session_id, run=run, keeps_inbox=keeps_inbox, reply=reply
        )
        try:
            self._children.ensure(session_id).tell(message)
        except ActorDeadError:
            raise ServiceUnavailableError(
                "the runtime is not running", service="execution"
            ) from None
        return await reply

    def wake(self, session_id: str, scope: Scope = "input") -> None:
        """Ring the session's doorbell; never blocks, never fails for the caller."""
        if self._ref is not None and self._ref.is_alive():
            self._ref.tell(Wake(session_id=session_id, scope=scope))

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
        if self._ref is not None and self._ref.is_alive():
            self._ref.tell(LeaseLost(session_id=session_id))

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
        if self._ref is None or not self._ref.is_alive():
            return
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._supervisor.ask(Shutdown(reply=reply))
        await reply
        await self._supervisor.stop()


class Standalone:
    """The session actors of a facade that runs nothing (an embedding's or a test's
    :class:`~actors.sessions.Sessions` without a runtime): started on first use,
    they serialise each session's commands; nothing is ever woken.

    An idle supervisor and idle session actors hold no task, so nothing needs closing.
    """

    def __init__(self) -> None:
        self._execution: asyncio.Future[Execution] | None = None

    async def command(self, session_id: str, run: Run, *, keeps_inbox: bool = False) -> Any:
        if self._execution is None:
            starting = self._execution = asyncio.get_running_loop().create_future()
            try:
                starting.set_result(await Execution.start(NoHooks()))
            except BaseException:
                self._execution = None
                starting.cancel()
                raise
        execution = await asyncio.shield(self._execution)
        return await execution.command(session_id, run, keeps_inbox=keeps_inbox)

    async def aclose(self) -> None:
        """Stop the actors (after the commands under way); later commands start them again."""
        starting, self._execution = self._execution, None
        if starting is not None and starting.done() and not starting.cancelled():
            await starting.result().shutdown()
