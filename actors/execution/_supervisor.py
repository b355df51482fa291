"""The supervisor: routes execution requests to session actors, retires idle ones."""

from __future__ import annotations

import asyncio
from typing import Any

from actors._actor import Actor
from actors._ref import ActorRef
from actors.execution._messages import (
    Active,
    AwaitIdle,
    ExecutionHooks,
    Idle,
    Interrupt,
    IsBusy,
    LeaseLost,
    Resume,
    Retire,
    Shutdown,
    Terminal,
    Wake,
)
from actors.execution._session import SessionActor


class Supervisor(Actor):
    """Routes execution requests to session actors; retires idle ones."""

    def __init__(self, hooks: ExecutionHooks) -> None:
        self._hooks = hooks
        self._sessions: dict[str, ActorRef[SessionActor]] = {}
        #: Messages sent to each session actor (see :meth:`_retire`).
        self._sent: dict[str, int] = {}
        self._closed = False

    async def on_receive(self, message: object) -> Any:
        # Requests for a session are forwarded, never awaited here: the answer
        # (a future) goes back to the asker, who waits for it, so one
        # session's handling never holds up the others' in this mailbox.
        match message:
            case Wake(session_id=sid) if not self._closed:
                self._send(await self._session(sid), message)
                return None
            case Resume(session_id=sid):
                if self._closed:
                    return _ready(_ready(Terminal(kind="interrupted", reason="shutdown")))
                return self._request(await self._session(sid), message)
            case Interrupt(session_id=sid) | LeaseLost(session_id=sid):
                ref = self._sessions.get(sid)
                return _ready(False) if ref is None else self._request(ref, message)
            case AwaitIdle(session_id=sid):
                ref = self._sessions.get(sid)
                return _ready(_ready(None)) if ref is None else self._request(ref, message)
            case Active():
                return [sid for sid in list(self._sessions) if await self._ask(sid, IsBusy())]
            case Idle(session_id=sid, received=received):
                await self._retire(sid, received)
                return None
            case Shutdown():
                return await self._shutdown()
            case Wake():
                return None  # closed: nothing new starts
        return await super().on_receive(message)

    async def _session(self, session_id: str) -> ActorRef[SessionActor]:
        ref = self._sessions.get(session_id)
        if ref is None:
            me = self.actor_ref

            def idle(sid: str, received: int) -> None:
                if me.is_alive():
                    me.tell(Idle(sid, received))

            ref = await SessionActor.start(session_id, self._hooks, idle)
            self._sessions[session_id] = ref
            self._sent[session_id] = 0
        return ref

    def _send(self, ref: ActorRef[SessionActor], message: Wake) -> None:
        self._sent[message.session_id] += 1
        ref.tell(message)

    def _request(self, ref: ActorRef[SessionActor], message: Any) -> asyncio.Future[Any]:
        self._sent[message.session_id] += 1
        return ref.request(message)

    async def _ask(self, session_id: str, message: object) -> Any:
        self._sent[session_id] += 1
        return await self._sessions[session_id].ask(message)

    async def _retire(self, session_id: str, received: int) -> None:
        """Stop an idle session actor, unless it has been sent something since.

        Every message a session actor gets comes from here. When it has
        handled as many as were sent to it by the time it said it was idle,
        nothing is on its way to it and it is idle still; otherwise it is
        asked (after whatever it has queued).
        """
        ref = self._sessions.get(session_id)
        if ref is None:
            return
        if self._sent[session_id] != received and not await self._ask(session_id, Retire()):
            return  # woken again since it said so
        del self._sessions[session_id]
        del self._sent[session_id]
        await ref.stop()

    async def _shutdown(self) -> list[asyncio.Future[None]]:
        self._closed = True
        waiters = []
        for sid in list(self._sessions):
            await self._ask(sid, Interrupt(sid, "shutdown"))
            waiters.append(await self._ask(sid, AwaitIdle(sid)))
        return waiters

    async def on_stop(self) -> None:
        for ref in list(self._sessions.values()):
            await ref.stop()
        self._sessions.clear()


def _ready(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
