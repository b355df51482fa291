"""What a busy period ends as, what it runs, and the messages between the actors."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Literal, Protocol

import attrs

from actors.session.inbox import Run, Scope
from protocol.events import ErrorInfo, InterruptReason


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


class Own(Protocol):
    """A drain's way to its own session actor (it runs ``run`` between two messages)."""

    async def command(self, run: Run, *, keeps_inbox: bool = False) -> Any: ...


class NoHooks:
    """The hooks of a supervisor that only serialises commands (a facade that runs nothing)."""

    async def started(self, session_id: str) -> None:
        pass

    async def drain(self, session_id: str, scope: Scope, force: bool, own: Own) -> None:
        pass

    async def settled(self, session_id: str, terminal: Terminal) -> None:
        pass


class ExecutionHooks(Protocol):
    """What a busy period does; the runtime supplies the durable versions."""

    async def started(self, session_id: str) -> None:
        """Publish ``execution.started`` (and the claim). Runs once, uncancelled."""

    async def drain(self, session_id: str, scope: Scope, force: bool, own: Own) -> None:
        """Run one drain; cancelled by ``interrupt``. ``own``: its session actor, asked
        at each boundary (the drain is that actor's child task)."""

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


# The messages. A request carries its own reply future: whoever ends up
# answering it (the supervisor from its own state, or the session actor it is
# forwarded to) resolves that future, so an answer is never a future of a future.


@attrs.frozen(kw_only=True)
class Wake:
    session_id: str
    scope: Scope = "input"


@attrs.frozen(kw_only=True)
class SessionCommand:
    """A write to one session: its actor runs ``run`` alone, between two other messages.

    The one message every command of a session travels as (admission, cancel,
    delivery change, promotion, control delivery, revert, shell notice,
    permission reply, agent/model/title change, deletion): no lock beside the
    actor, because nothing else writes the session's inbox.
    """

    session_id: str
    run: Run = attrs.field(eq=False, repr=False)
    #: Whether the pending input the actor knows (:attr:`Writer.inbox`) survives
    #: ``run``: a read or a promotion, which keeps it up to date itself.
    keeps_inbox: bool = False
    #: From the session's own drain (not counted in the supervisor's books), with
    #: the drain's context, which ``run`` sees (its lease fence marks the writes).
    own: contextvars.Context | None = attrs.field(default=None, eq=False, repr=False)
    reply: asyncio.Future[Any] = attrs.field(eq=False, repr=False)


@attrs.frozen(kw_only=True)
class Resume:
    session_id: str
    reply: asyncio.Future[Terminal] = attrs.field(eq=False, repr=False)


@attrs.frozen(kw_only=True)
class Interrupt:
    session_id: str
    reason: InterruptReason = "user"
    #: None: nobody waits for the answer (the supervisor's shutdown).
    reply: asyncio.Future[bool] | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class LeaseLost:
    session_id: str


@attrs.frozen(kw_only=True)
class AwaitIdle:
    """Answered by the supervisor once the session has no busy period (successors included)."""

    session_id: str
    reply: asyncio.Future[None] = attrs.field(eq=False, repr=False)


@attrs.frozen(kw_only=True)
class Active:
    """The sessions with a busy period: the supervisor's own books (an ask's answer)."""


@attrs.frozen(kw_only=True)
class Idle:
    """A session actor is idle after the ``kicks`` wakes and resumes it handled."""

    session_id: str
    #: Which actor: a report from one that has since retired is stale.
    ref: Any = attrs.field(eq=False, repr=False)
    kicks: int = 0


@attrs.frozen(kw_only=True)
class Settled:
    """A session actor to itself: its busy period ended (an empty mailbox retires it)."""


@attrs.frozen(kw_only=True)
class Children:
    """Asked of the supervisor once, by its facade: the directory of its session actors."""


@attrs.frozen(kw_only=True)
class Shutdown:
    """Interrupt every busy period (reason ``shutdown``); answered once none is left."""

    reply: asyncio.Future[None] = attrs.field(eq=False, repr=False)
