"""The supervisor: routes execution requests to session actors, retires idle ones.

It answers from its own books and never waits for a child inside a handler.
For each live session actor it counts the messages it has sent it, notes the
count at the last ``Wake`` or ``Resume`` (each starts or joins a busy period)
and the count the actor last reported with ``Idle``. A session is *active*
while a kick is newer than its last idle report: from the moment its wake is
sent until it says it is idle after handling it, successors included. So
``Active``, ``AwaitIdle``, an ``Interrupt`` of an idle session and
``Shutdown`` are answered here, and a request only a session can answer
(``Resume``, an ``Interrupt`` of an active one) is forwarded with its own
reply future, which the session actor resolves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from actors.execution._messages import (
    Active,
    AwaitIdle,
    ExecutionHooks,
    Idle,
    Interrupt,
    LeaseLost,
    Resume,
    Retire,
    SessionCommand,
    Shutdown,
    Terminal,
    Wake,
)
from actors.execution._session import SessionActor
from actors.kit import Actor, ActorRef


@attrs.define
class _Child:
    """The supervisor's books on one live session actor."""

    ref: ActorRef[SessionActor]
    #: Messages sent to it.
    sent: int = 0
    #: ``sent`` just after the last Wake or Resume: it is busy until it reports past it.
    kicked: int = 0
    #: ``received`` of its last Idle report.
    idle_at: int = 0
    #: AwaitIdle replies, answered when it is no longer active.
    idle_waiters: list[asyncio.Future[None]] = attrs.field(factory=list)

    @property
    def active(self) -> bool:
        return self.kicked > self.idle_at

    def send(self, message: object) -> None:
        self.sent += 1
        self.ref.tell(message)


class Supervisor(Actor):
    """Routes execution requests to session actors; retires idle ones."""

    def __init__(self, hooks: ExecutionHooks) -> None:
        self._hooks = hooks
        self._children: dict[str, _Child] = {}
        self._closed = False
        #: Shutdown replies, answered once no session is active.
        self._shutdowns: list[asyncio.Future[None]] = []

    async def on_receive(self, message: object) -> Any:
        match message:
            case SessionCommand(session_id=sid):
                # A command may start a busy period (an admission's wake): it
                # counts as a kick until the actor says it is idle after it.
                self._kick(await self._child(sid), message)
            case Wake(session_id=sid) if not self._closed:
                self._kick(await self._child(sid), message)
            case Resume(session_id=sid, reply=reply):
                if self._closed:
                    _resolve(reply, Terminal(kind="interrupted", reason="shutdown"))
                else:
                    self._kick(await self._child(sid), message)
            case Interrupt(session_id=sid, reply=reply):
                child = self._children.get(sid)
                if child is not None and child.active:
                    child.send(message)
                elif reply is not None:
                    _resolve(reply, False)  # idle: nothing to interrupt
            case LeaseLost(session_id=sid):
                child = self._children.get(sid)
                if child is not None and child.active:
                    child.send(message)
            case AwaitIdle(session_id=sid, reply=reply):
                child = self._children.get(sid)
                if child is None or not child.active:
                    _resolve(reply, None)
                else:
                    child.idle_waiters = [w for w in child.idle_waiters if not w.done()]
                    child.idle_waiters.append(reply)
            case Active():
                return [sid for sid, child in self._children.items() if child.active]
            case Idle(session_id=sid, received=received):
                self._idle(sid, received)
            case Shutdown(reply=reply):
                self._closed = True
                self._shutdowns.append(reply)
                for sid, child in self._children.items():
                    if child.active:
                        child.send(Interrupt(session_id=sid, reason="shutdown"))
                self._answer_shutdowns()
            case Wake():
                pass  # closed: nothing new starts
            case _:
                return await super().on_receive(message)
        return None

    async def _child(self, session_id: str) -> _Child:
        child = self._children.get(session_id)
        if child is None:
            me = self.actor_ref

            def idle(sid: str, handled: int) -> None:
                if me.is_alive():
                    me.tell(Idle(session_id=sid, received=handled))

            ref = await SessionActor.start(session_id, self._hooks, idle)
            child = self._children[session_id] = _Child(ref)
        return child

    @staticmethod
    def _kick(child: _Child, message: Wake | Resume | SessionCommand) -> None:
        child.send(message)
        child.kicked = child.sent

    def _idle(self, session_id: str, received: int) -> None:
        """A session said it is idle: answer its waiters, retire it if nothing is on its way.

        Every message a session actor gets comes from here, so when it has
        handled as many as were sent to it, nothing is in flight and it stays
        idle; otherwise it reports again after handling the rest.
        """
        child = self._children.get(session_id)
        if child is None:
            return
        child.idle_at = max(child.idle_at, received)
        if child.active:
            return  # woken again since it said so
        waiters, child.idle_waiters = child.idle_waiters, []
        for waiter in waiters:
            _resolve(waiter, None)
        if child.sent == received:
            del self._children[session_id]
            child.ref.tell(Retire())
        self._answer_shutdowns()

    def _answer_shutdowns(self) -> None:
        if self._shutdowns and not any(child.active for child in self._children.values()):
            replies, self._shutdowns = self._shutdowns, []
            for reply in replies:
                _resolve(reply, None)

    async def on_stop(self) -> None:
        # Stopping is the owner's duty to its children, not a handler: wait for each.
        children, self._children = list(self._children.values()), {}
        for child in children:
            await child.ref.stop()
            for waiter in child.idle_waiters:
                _resolve(waiter, None)
        replies, self._shutdowns = self._shutdowns, []
        for reply in replies:
            _resolve(reply, None)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
