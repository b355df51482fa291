"""The supervisor: owns the session actors, keeps the books on busy periods;
and :class:`Execution`, the facade the rest of the runtime calls.

A session actor is made when a message for its session arrives and retires
itself when it is idle with an empty mailbox (:meth:`SessionActor.on_drained`),
so an idle session costs no actor. :class:`SessionActors` is the supervisor's
directory of the live ones: commands reach a session actor through it
directly (one hop, as a lock acquire would cost), while everything that
starts, joins or stops a busy period goes through the supervisor's mailbox.

It answers from its own books and never waits for a child inside a handler.
For each session with a busy period it counts the wakes and resumes it sent
(each starts or joins one) and the count its actor last reported idle after
(:class:`Idle`). A session is *active* while a kick is newer than its last
idle report: from the moment its wake is sent until its actor says it is idle
after handling it, successors included. So ``Active``, ``AwaitIdle``, an
``Interrupt`` of an idle session and ``Shutdown`` are answered here, and a
request only a session can answer (``Resume``, an ``Interrupt`` of an active
one) is forwarded with its own reply future, which the session actor resolves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from actors.kit import Actor, ActorDeadError, ActorRef
from actors.session.actor import SessionActor
from actors.session.inbox import Run, Scope
from actors.session.messages import (
    Active,
    AwaitIdle,
    Children,
    ExecutionHooks,
    Idle,
    Interrupt,
    LeaseLost,
    NoHooks,
    Resume,
    SessionCommand,
    Shutdown,
    Terminal,
    Wake,
)
from protocol.errors import ServiceUnavailableError
from protocol.events import InterruptReason


class SessionActors:
    """The live session actors, at most one per session (bounded by the sessions
    with a message on its way or a busy period: idle ones have retired).

    Owned by the supervisor, which stops them all when it stops; its facade
    sends commands through :meth:`ensure`. Everything here is synchronous and
    runs on the loop, so a lookup and the message put after it cannot be
    separated by a retirement.
    """

    def __init__(self, hooks: ExecutionHooks, supervisor: ActorRef[Supervisor]) -> None:
        self._hooks = hooks
        self._supervisor = supervisor
        self._live: dict[str, ActorRef[SessionActor]] = {}
        self._closed = False

    def get(self, session_id: str) -> ActorRef[SessionActor] | None:
        return self._live.get(session_id)

    def live(self) -> list[ActorRef[SessionActor]]:
        """The live session actors (they are not in the global ``ActorRegistry``)."""
        return [ref for ref in self._live.values() if ref.is_alive()]

    def ensure(self, session_id: str) -> ActorRef[SessionActor]:
        """The session's live actor, made now if it has none."""
        ref = self._live.get(session_id)
        if ref is None or not ref.is_alive():  # (one stopped by a broken handler)
            if self._closed:
                raise ServiceUnavailableError("the runtime is not running", service="execution")
            ref = self._live[session_id] = SessionActor.spawn(
                session_id, self._hooks, self._idle, self._retired
            )
        return ref

    def _idle(self, session_id: str, ref: ActorRef[SessionActor], kicks: int) -> None:
        if self._supervisor.is_alive():
            self._supervisor.tell(Idle(session_id=session_id, ref=ref, kicks=kicks))

    def _retired(self, session_id: str, ref: ActorRef[SessionActor]) -> None:
        if self._live.get(session_id) is ref:
            del self._live[session_id]

    async def close(self) -> None:
        """Stop every live session actor (their busy periods are cancelled); no new ones."""
        self._closed = True
        while self._live:
            _, ref = self._live.popitem()
            await ref.stop()


@attrs.define
class _Books:
    """The supervisor's books on one session with a busy period (or one on its way)."""

    #: The actor the last kick went to; reports from any other are stale.
    ref: ActorRef[SessionActor]
    #: Wakes and resumes sent to ``ref``: it is busy until it reports past them.
    kicked: int = 0
    #: ``kicks`` of its last Idle report.
    idle_at: int = 0
    #: AwaitIdle replies, answered when it is no longer active.
    idle_waiters: list[asyncio.Future[None]] = attrs.field(factory=list)

    @property
    def active(self) -> bool:
        return self.kicked > self.idle_at


class Supervisor(Actor):
    """Owns the session actors; starts, joins and stops their busy periods."""

    def __init__(self, hooks: ExecutionHooks) -> None:
        self._hooks = hooks
        self._books: dict[str, _Books] = {}
        self._closed = False
        #: Shutdown replies, answered once no session is active.
        self._shutdowns: list[asyncio.Future[None]] = []
        self._children: SessionActors | None = None

    async def on_start(self) -> None:
        self._children = SessionActors(self._hooks, self.actor_ref)

    @property
    def children(self) -> SessionActors:
        assert self._children is not None, "made in on_start"
        return self._children

    async def on_receive(self, message: object) -> Any:
        match message:
            case Wake(session_id=sid) if not self._closed:
                self._kick(sid, message)
            case Resume(session_id=sid, reply=reply):
                if self._closed:
                    _resolve(reply, Terminal(kind="interrupted", reason="shutdown"))
                else:
                    self._kick(sid, message)
            case Interrupt(session_id=sid, reply=reply):
                books = self._books.get(sid)
                if books is not None and books.active and books.ref.is_alive():
                    books.ref.tell(message)
                elif reply is not None:
                    _resolve(reply, False)  # idle: nothing to interrupt
            case LeaseLost(session_id=sid):
                books = self._books.get(sid)
                if books is not None and books.active and books.ref.is_alive():
                    books.ref.tell(message)
            case AwaitIdle(session_id=sid, reply=reply):
                books = self._books.get(sid)
                if books is None or not books.active:
                    _resolve(reply, None)
                else:
                    books.idle_waiters = [w for w in books.idle_waiters if not w.done()]
                    books.idle_waiters.append(reply)
            case Active():
                return [sid for sid, books in self._books.items() if books.active]
            case Idle(session_id=sid, ref=ref, kicks=kicks):
                self._idle(sid, ref, kicks)
            case Children():
                return self.children
            case Shutdown(reply=reply):
                self._closed = True
                self._shutdowns.append(reply)
                for sid, books in self._books.items():
                    if books.active and books.ref.is_alive():
                        books.ref.tell(Interrupt(session_id=sid, reason="shutdown"))
                self._answer_shutdowns()
            case Wake():
                pass  # closed: nothing new starts
            case _:
                return await super().on_receive(message)
        return None

    def _kick(self, session_id: str, message: Wake | Resume) -> None:
        ref = self.children.ensure(session_id)
        books = self._books.get(session_id)
        if books is None:
            books = self._books[session_id] = _Books(ref)
        elif books.ref is not ref:
            # Its actor retired (its idle report is still on its way): the new
            # one inherits the waiters, which wait for this busy period too.
            books.ref, books.kicked, books.idle_at = ref, 0, 0
        books.kicked += 1
        ref.tell(message)

    def _idle(self, session_id: str, ref: ActorRef[SessionActor], kicks: int) -> None:
        """A session actor said it is idle: answer the waiters, close the books."""
        books = self._books.get(session_id)
        if books is None or books.ref is not ref:
            return  # stale: from an actor that has retired since
        books.idle_at = max(books.idle_at, kicks)
        if books.active:
            return  # woken again since it said so
        del self._books[session_id]
        for waiter in books.idle_waiters:
            _resolve(waiter, None)
        self._answer_shutdowns()

    def _answer_shutdowns(self) -> None:
        if self._shutdowns and not any(books.active for books in self._books.values()):
            replies, self._shutdowns = self._shutdowns, []
            for reply in replies:
                _resolve(reply, None)

    async def on_stop(self) -> None:
        # Stopping is the owner's duty to its children, not a handler: wait for each.
        await self.children.close()
        books, self._books = list(self._books.values()), {}
        for entry in books:
            for waiter in entry.idle_waiters:
                _resolve(waiter, None)
        replies, self._shutdowns = self._shutdowns, []
        for reply in replies:
            _resolve(reply, None)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


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

    def session_actors(self) -> list[ActorRef[SessionActor]]:
        """The live session actors, at most one per session (an idle session has none)."""
        return [] if self._children is None else self._children.live()

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

    def session_actors(self) -> list[ActorRef[SessionActor]]:
        """The live session actors (see :meth:`Execution.session_actors`)."""
        execution = self._execution
        if execution is None or not execution.done() or execution.cancelled():
            return []
        return execution.result().session_actors()

    async def aclose(self) -> None:
        """Stop the actors (after the commands under way); later commands start them again."""
        starting, self._execution = self._execution, None
        if starting is not None and starting.done() and not starting.cancelled():
            await starting.result().shutdown()
