"""One session's busy periods and doorbell: the session actor."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import Any

from actors.kit import Actor, ActorDeadError, ActorRef
from actors.session.inbox import Run, Scope
from actors.session.messages import (
    SUCCEEDED,
    ExecutionHooks,
    Interrupt,
    LeaseLost,
    Resume,
    SessionCommand,
    Settled,
    Terminal,
    Wake,
    error_info,
    widest,
)
from protocol.errors import ServiceUnavailableError
from protocol.events import InterruptReason
from protocol.shapes import InboxItem
from storage import FencedError, LeaseHeldError, StorageBrokenError

log = logging.getLogger("actors.session")


class SessionActor(Actor):
    """The only writer of one session: its commands, its busy periods, its doorbell.

    Every write to the session (:class:`SessionCommand`) runs in this actor's
    handler, one at a time, so nothing else needs a lock. The busy-period
    task is this actor's child: it is created and cancelled only by this
    actor's handlers, mutates this actor's state between awaits on the same
    loop, and asks this actor (:class:`OwnActor`) at each boundary what to
    deliver, so a promotion is a command like any other.
    """

    #: Found through the supervisor's directory (:class:`~actors.supervisor.SessionActors`),
    #: which stops them, not through the global registry: one is made per command
    #: for a session that had none.
    registered = False
    #: A command sent within a loop turn of the last one (the next admission of a
    #: caller that awaited the previous) finds this actor still here.
    linger_turns = 1

    # The state of an actor with no busy period: class-level defaults, set on
    # the instance only once they change (an actor is made per command for a
    # session that had none; most never start a busy period).
    #: Wakes and resumes handled (each may start a busy period), and how many
    #: of them the supervisor was last told this actor is idle after.
    _kicks = 0
    _reported = 0
    #: The session's pending input as the last read or promotion left it;
    #: None once any other command ran (nothing but commands writes it here).
    inbox: list[InboxItem] | None = None
    _busy: asyncio.Task[None] | None = None
    #: While the busy task runs ``started`` or ``settled``, which must land
    #: whole, a cancellation waits (``_deferred``) until it returns.
    _shielded = False
    _deferred = False
    _terminal: asyncio.Future[Terminal] | None = None
    _pending: Scope | None = None
    _pending_force = False
    _successor: asyncio.Future[Terminal] | None = None
    _stopping = False
    _settling = False
    _reason: InterruptReason | None = None
    _fenced = False

    def __init__(
        self,
        session_id: str,
        hooks: ExecutionHooks,
        on_idle: Callable[[str, ActorRef[SessionActor], int], None],
        on_retire: Callable[[str, ActorRef[SessionActor]], None],
    ) -> None:
        self.session_id = session_id
        self._hooks = hooks
        self._on_idle = on_idle
        self._on_retire = on_retire

    @property
    def busy(self) -> bool:
        """Whether a busy period runs (or settles) now."""
        return self._busy is not None

    async def on_receive(self, message: object) -> Any:
        if type(message) is SessionCommand:
            # Most messages are commands: run here, not in a helper (one frame
            # fewer for each of the command's awaits to pass through).
            reply = message.reply
            if reply.done():
                return None  # its asker gave up meanwhile
            own = message.own
            # The drain's command runs in the drain's context (its lease fence).
            tokens = None if own is None else [var.set(value) for var, value in own.items()]
            if not message.keeps_inbox:
                self.inbox = None
            try:
                result = await message.run(self)
            except asyncio.CancelledError:
                # This actor is stopping (the handler in flight is cancelled).
                self.inbox = None
                if not reply.done():
                    reply.set_exception(_gone())
                raise
            except Exception as exc:
                self.inbox = None
                if not reply.done():
                    reply.set_exception(exc)
            else:
                if not reply.done():
                    reply.set_result(result)
            finally:
                if tokens is not None:
                    for token in reversed(tokens):
                        token.var.reset(token)
            return None
        match message:
            case Wake(scope=scope):
                self._kicks += 1
                if self._busy is None:
                    _ = self._start(scope, force=False)
                else:
                    self._pending = widest(self._pending, scope)
            case Resume(reply=reply):
                self._kicks += 1
                self._resume().add_done_callback(lambda terminal: _answer(reply, terminal))
            case Interrupt(reason=reason, reply=answer):
                interrupted = self._interrupt(reason)
                if answer is not None and not answer.done():
                    answer.set_result(interrupted)
            case LeaseLost():
                self._lease_lost()
            case Settled():
                pass  # the busy period ended: the mailbox may be drained now
            case _:
                return await super().on_receive(message)
        self._report_idle()
        return None

    def on_drained(self) -> bool:
        """Retire once idle: an idle session costs no actor (a message makes a new one)."""
        if self._busy is not None:
            return False
        self._on_retire(self.session_id, self.actor_ref)
        return True

    def _report_idle(self) -> None:
        """Tell the supervisor this actor is idle, once per wake or resume it handled."""
        if self._busy is None and self._kicks > self._reported:
            self._reported = self._kicks
            self._on_idle(self.session_id, self.actor_ref, self._kicks)

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
        # Idle, already stopping, or settled (its terminal is being recorded):
        # a no-op, as the contract says, so a wake rung meanwhile still starts
        # its successor (the answer says nothing was interrupted; nothing is).
        if self._busy is None or self._stopping or self._settling:
            return False
        self._pending = None
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
        # Shielded from its first step: a task cancelled before it ever ran
        # never runs its body, so it would never settle (an interrupt or a
        # shutdown handled right after the wake that started it).
        self._shielded = True
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
                own = OwnActor(self.actor_ref, self.session_id)  # no cycle through the actor
                while True:
                    await self._hooks.drain(self.session_id, scope, force, own)
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
        self._report_idle()
        if self.actor_ref.is_alive():
            self.actor_ref.tell(Settled())  # so that an empty mailbox retires this actor


class OwnActor:
    """A drain's handle on its session actor: a command as a future and a mailbox put."""

    __slots__ = ("_ref", "_session_id")

    def __init__(self, ref: ActorRef[SessionActor], session_id: str) -> None:
        self._ref = ref
        self._session_id = session_id

    async def command(self, run: Run, *, keeps_inbox: bool = False) -> Any:
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        message = SessionCommand(
            session_id=self._session_id,
            run=run,
            keeps_inbox=keeps_inbox,
            own=contextvars.copy_context(),
            reply=reply,
        )
        try:
            self._ref.tell(message)
        except ActorDeadError:
            raise _gone() from None
        return await reply


def _gone() -> ServiceUnavailableError:
    return ServiceUnavailableError("the session's actor has stopped", service="execution")


def _answer(reply: asyncio.Future[Terminal], terminal: asyncio.Future[Terminal]) -> None:
    """Hand a busy period's terminal to one Resume's own reply (unless its asker left)."""
    if not reply.done():
        reply.set_result(terminal.result())
