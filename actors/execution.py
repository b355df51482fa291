"""Execution: who runs a session's drains, when, and how a busy period ends.

A **busy period** is one execution of a session: it starts (``started``: the
durable ``session.execution.started`` with its write-ahead claim), runs one or
more drains, and settles (``settled``: exactly one terminal event) before any
waiter is told. The rules are those of the original's run coordinator:

- ``wake`` while idle starts a busy period (its first drain runs one tick
  later); wakes during a busy period ring a doorbell, and any number of rings
  cause exactly one more drain. The widest scope wins (``input`` over
  ``steer``); a scope consumed by a drain is not carried into the next one.
- ``resume`` joins the active busy period and returns its terminal; while
  idle it starts one (forced); while stopping it waits for cleanup and starts
  a forced successor. A waiter that gives up does not cancel the execution.
- ``interrupt`` is a no-op (False) when idle or already stopping; during the
  settlement window it only clears the doorbell; otherwise it clears the
  doorbell (those wakes belonged to the cancelled intent), records the reason
  and cancels the drains, answering True before cleanup finishes. A wake or
  resume that arrives during cleanup starts a successor at settlement.
- Different sessions run concurrently; drains loop instead of recursing, so a
  self-waking session keeps a flat stack.

Each session's state lives in its own :class:`SessionActor`; the
:class:`Supervisor` actor routes to them, creates them on demand and retires
them when idle (an idle session costs no actor at all). :class:`Execution` is
the synchronous/async facade the rest of the runtime calls.

Terminal classification: success -> ``succeeded``; an interrupt with reason
``user`` -> ``interrupted(user)``; cancellation without a reason (teardown)
-> ``interrupted(shutdown)``; any other exception -> ``failed {type, message}``.

Several hosts (see :mod:`storage.lease`): ``started`` takes the session's
lease. When another host holds it live (:class:`~storage.LeaseHeldError`)
the busy period ends at once as ``elsewhere`` (naming the owner, the scope
and whether it was forced) and nothing is written: the hooks forward the
work to the owner. When this host loses the lease while it works (a
:class:`~storage.FencedError` from an append, or ``lease_lost`` from the
renewal) the drains are cancelled and the busy period ends as ``fenced``:
the terminal belongs to whoever holds the lease now, so none is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol

import attrs

from actors._actor import Actor
from actors._ref import ActorRef
from actors.inbox import Scope
from protocol.events import ErrorInfo, InterruptReason
from storage import FencedError, LeaseHeldError, StorageBrokenError

__all__ = [
    "Execution",
    "ExecutionHooks",
    "SessionActor",
    "Supervisor",
    "Terminal",
    "error_info",
]

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Terminal:
    """How a busy period ended."""

    kind: Literal["succeeded", "failed", "interrupted", "elsewhere", "fenced"]
    reason: InterruptReason | None = None
    error: ErrorInfo | None = None
    #: ``elsewhere``: the host that holds the lease, and what to ask it for.
    owner: str | None = None
    scope: Scope = "input"
    force: bool = False

    @property
    def written(self) -> bool:
        """Whether this host records the terminal (it held the lease to the end)."""
        return self.kind not in ("elsewhere", "fenced")


SUCCEEDED = Terminal(kind="succeeded")


class ExecutionHooks(Protocol):
    """What a busy period does; the runtime supplies the durable versions."""

    async def started(self, session_id: str) -> None:
        """Publish ``execution.started`` (and the claim). Runs once, uncancelled."""

    async def drain(self, session_id: str, scope: Scope, force: bool) -> None:
        """Run one drain; cancelled by ``interrupt``."""

    async def settled(self, session_id: str, terminal: Terminal) -> None:
        """Publish the single terminal event. Runs once, uncancelled."""


def error_info(exc: BaseException) -> ErrorInfo:
    """The public ``{type, message}`` of an exception that failed an execution."""
    kind = getattr(exc, "type", None)
    return ErrorInfo(
        type=kind if isinstance(kind, str) else "unknown",
        message=str(exc) or type(exc).__name__,
    )


def widest(a: Scope | None, b: Scope) -> Scope:
    return "input" if "input" in (a, b) else "steer"


# -- messages -------------------------------------------------------------------------------------


@attrs.frozen
class Wake:
    session_id: str
    scope: Scope = "input"


@attrs.frozen
class Resume:
    session_id: str


@attrs.frozen
class Interrupt:
    session_id: str
    reason: InterruptReason = "user"


@attrs.frozen
class LeaseLost:
    session_id: str


@attrs.frozen
class AwaitIdle:
    session_id: str


@attrs.frozen
class Active:
    pass


@attrs.frozen
class IsBusy:
    pass


@attrs.frozen
class Idle:
    """A session actor found itself idle, having handled ``received`` messages;
    the supervisor may retire it."""

    session_id: str
    received: int = 0


@attrs.frozen
class Retire:
    pass


@attrs.frozen
class Shutdown:
    pass


# -- one session ----------------------------------------------------------------------------------


class SessionActor(Actor):
    """Owns one session's busy periods and its doorbell.

    The busy-period task is this actor's child: it is created and cancelled
    only by this actor's handlers, and it mutates this actor's state between
    awaits on the same loop, never concurrently with a handler.
    """

    def __init__(
        self, session_id: str, hooks: ExecutionHooks, on_idle: Callable[[str, int], None]
    ) -> None:
        self.session_id = session_id
        self._hooks = hooks
        self._on_idle = on_idle
        #: Messages handled so far (the supervisor compares it with what it sent).
        self._received = 0
        self._busy: asyncio.Task[None] | None = None
        #: While the busy task runs ``started`` or ``settled``, which must land
        #: whole, a cancellation waits (``_deferred``) until it returns.
        self._shielded = False
        self._deferred = False
        self._terminal: asyncio.Future[Terminal] | None = None
        self._pending: Scope | None = None
        self._pending_force = False
        self._successor: asyncio.Future[Terminal] | None = None
        self._stopping = False
        self._settling = False
        self._reason: InterruptReason | None = None
        self._fenced = False
        self._idle_waiters: list[asyncio.Future[None]] = []

    async def on_receive(self, message: object) -> Any:
        self._received += 1
        match message:
            case Wake(scope=scope):
                if self._busy is None:
                    _ = self._start(scope, force=False)
                else:
                    self._pending = widest(self._pending, scope)
                return None
            case Resume():
                return self._resume()
            case Interrupt(reason=reason):
                return self._interrupt(reason)
            case LeaseLost():
                return self._lease_lost()
            case AwaitIdle():
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                if self._busy is None:
                    waiter.set_result(None)
                else:
                    self._idle_waiters.append(waiter)
                return waiter
            case IsBusy():
                return self._busy is not None
            case Retire():
                return self._busy is None
        return await super().on_receive(message)

    async def on_stop(self) -> None:
        busy = self._busy
        if busy is not None:
            if not self._stopping:
                self._stopping = True
                self._reason = None  # teardown: classified as shutdown
                self._cancel_busy()
            with contextlib.suppress(asyncio.CancelledError):
                await busy

    def _resume(self) -> asyncio.Future[Terminal]:
        if self._busy is None:
            return self._start("input", force=True)
        if not self._stopping:
            assert self._terminal is not None
            return self._terminal
        self._pending_force = True
        if self._successor is None:
            self._successor = asyncio.get_running_loop().create_future()
        return self._successor

    def _interrupt(self, reason: InterruptReason) -> bool:
        if self._busy is None or self._stopping:
            return False
        self._pending = None
        if self._settling:
            return False
        self._stopping = True
        self._reason = reason
        self._cancel_busy()
        return True

    def _lease_lost(self) -> bool:
        if self._busy is None or self._settling:
            return False
        self._pending = None
        self._fenced = True
        if not self._stopping:
            self._stopping = True
            self._cancel_busy()
        return True

    def _cancel_busy(self) -> None:
        """Cancel the busy task, or, while it runs ``started`` or ``settled``
        (each lands whole), as soon as that returns.

        Only this actor cancels its busy task, so this replaces a shielding
        task around each of the two (two tasks per busy period fewer).
        """
        assert self._busy is not None
        if self._shielded:
            self._deferred = True
        else:
            self._busy.cancel()

    def _start(
        self, scope: Scope, *, force: bool, terminal: asyncio.Future[Terminal] | None = None
    ) -> asyncio.Future[Terminal]:
        self._terminal = terminal or asyncio.get_running_loop().create_future()
        self._busy = asyncio.get_running_loop().create_task(
            self._run(scope, force, self._terminal), name=f"execution:{self.session_id}"
        )
        return self._terminal

    async def _run(self, scope: Scope, force: bool, terminal: asyncio.Future[Terminal]) -> None:
        outcome: Terminal
        try:
            try:
                self._shielded = True
                try:
                    await self._hooks.started(self.session_id)
                finally:
                    self._shielded = False
                    cancelled, self._deferred = self._deferred, False
                if cancelled:
                    raise asyncio.CancelledError  # asked for while it ran
            except LeaseHeldError as exc:
                # Another host runs it: hand it this wake (and any rung meanwhile).
                wanted = scope if self._pending is None else widest(self._pending, scope)
                self._pending = None
                outcome = Terminal(kind="elsewhere", owner=exc.owner, scope=wanted, force=force)
            else:
                while True:
                    await self._hooks.drain(self.session_id, scope, force)
                    if self._pending is None:
                        break
                    scope, self._pending, force = self._pending, None, False
                outcome = SUCCEEDED
        except asyncio.CancelledError:
            # Only this actor cancels its busy task (interrupt, lease loss, or
            # teardown in on_stop): the cancellation is the outcome, not a
            # reason to skip settlement, so it is not re-raised.
            if self._fenced:
                outcome = Terminal(kind="fenced")
            else:
                outcome = Terminal(kind="interrupted", reason=self._reason or "shutdown")
        except FencedError as exc:
            log.warning("execution of %s lost its lease: %s", self.session_id, exc)
            self._pending = None
            outcome = Terminal(kind="fenced")
        except Exception as exc:
            log.info("execution of %s failed", self.session_id, exc_info=exc)
            outcome = Terminal(kind="failed", error=error_info(exc))
        self._settling = True
        self._shielded = True
        try:
            await self._hooks.settled(self.session_id, outcome)
        except StorageBrokenError as exc:
            # Disk full or an I/O error: the message is the news, a traceback is noise
            # (the claim stays, so the next start recovers the session).
            log.error("settling %s failed: %s", self.session_id, exc)
        except Exception:
            log.exception("settling %s failed", self.session_id)
        finally:
            # A cancellation asked for meanwhile has nothing left to cut short.
            self._shielded = self._deferred = False
            self._after_settle(outcome, terminal)

    def _after_settle(self, outcome: Terminal, terminal: asyncio.Future[Terminal]) -> None:
        if not terminal.done():
            terminal.set_result(outcome)
        self._busy = None
        self._terminal = None
        self._settling = False
        self._stopping = False
        self._reason = None
        self._fenced = False
        if self._pending is not None or self._pending_force:
            scope: Scope = self._pending or "input"
            force, successor = self._pending_force, self._successor
            self._pending, self._pending_force, self._successor = None, False, None
            _ = self._start(scope, force=force, terminal=successor)
            return
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._on_idle(self.session_id, self._received)


# -- the supervisor -------------------------------------------------------------------------------


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


# -- the facade -----------------------------------------------------------------------------------


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
