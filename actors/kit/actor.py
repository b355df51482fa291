"""Actor: the base class for asyncio actors (supervisor, sessions, store front).

Subclass :class:`Actor`, override the hooks, and start it::

    class Counter(Actor):
        def __init__(self, start: int) -> None:
            self.count = start

        async def on_receive(self, message: object) -> object:
            match message:
                case Add(n=n):
                    self.count += n
                    return None
                case Get():
                    return self.count
            return await super().on_receive(message)

    ref = await Counter.start(0)
    ref.tell(Add(n=2))
    assert await ref.ask(Get()) == 2
    await ref.stop()

The shape is pykka's, so the same mental model serves the threads at the
blocking edge, but every hook is a coroutine: an actor on the event loop waits
by awaiting (the store, a provider stream, a blocking job through
``BlockingExecutor``) and must never block. For the same reason ``start`` is a
coroutine: it returns only after ``on_start`` has completed and the actor is
registered, so whoever holds a ref holds a ready actor and an ``on_start``
failure is raised to the code that asked for the actor, not logged somewhere.

Unlike pykka, ``__init__`` needs no ``super().__init__()`` call: the runtime
attaches the ref after construction, so ``actor_ref`` is available from
``on_start`` on. The mailbox and the error policy are described in
:mod:`actors.kit.mailbox`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, ClassVar, ParamSpec, Self, TypeVar

from actors.kit import registry
from actors.kit.mailbox import Mailbox
from actors.kit.ref import ActorRef

__all__ = ["Actor"]

_log = logging.getLogger("actors")

P = ParamSpec("P")
A = TypeVar("A", bound="Actor")
#: Numbers for actor URNs: unique in this process, which is the registry's scope
#: (uuid4 cost a getrandom system call and a UUID object per actor, several per
#: step); the urn string is made only when asked for.
_URNS = itertools.count(1)


class Actor:
    """Base class for an asyncio actor; subclasses override the ``on_*`` hooks.

    Hooks run one at a time, in the actor's own task, never concurrently:
    ``on_start`` once, then ``on_receive`` per message (and ``on_failure`` for a
    told message whose handler raised), then ``on_stop`` once.
    """

    _actor_ref: ActorRef[Any] | None = None

    #: Whether :class:`ActorRegistry` lists the actor. False for actors made on
    #: demand by an owner that keeps its own directory of them and stops them
    #: when it stops (the supervisor's session actors): the owner finds them,
    #: and a global table entry per actor made per command is work for nothing.
    registered: ClassVar[bool] = True

    #: Loop turns the drain task waits, once the mailbox is empty, before it
    #: asks :meth:`on_drained` and ends (0: at once). A message put within them
    #: is handled by the same task, and an actor that retires when drained is
    #: not made again for it. Bounded (the count starts again only after a
    #: message is handled) and the drain task's own: ``stop`` cancels it.
    linger_turns: ClassVar[int] = 0

    @classmethod
    async def start(cls: Callable[P, A], *args: P.args, **kwargs: P.kwargs) -> ActorRef[A]:
        """Construct the actor with the given arguments, run ``on_start``, register it.

        Must be awaited on the event loop the actor will live on.

        Raises:
            Exception: whatever ``on_start`` raised; the actor is then never
                registered and ``on_stop`` does not run.
        """
        ref, mailbox = _wire(cls(*args, **kwargs))
        await mailbox.start(**_registration(ref))
        return ref

    @classmethod
    def spawn(cls: Callable[P, A], *args: P.args, **kwargs: P.kwargs) -> ActorRef[A]:
        """:meth:`start` without the await, for an actor with no ``on_start``.

        For actors made on demand, many times a second (one per session, made
        when a message arrives): the ref is ready when this returns.

        Raises:
            TypeError: the class overrides ``on_start`` (use :meth:`start`).
        """
        actor = cls(*args, **kwargs)
        if type(actor).on_start is not Actor.on_start:
            raise TypeError(f"{type(actor).__name__} has an on_start; use start()")
        ref, mailbox = _wire(actor)
        mailbox.open(**_registration(ref))
        return ref

    @property
    def actor_ref(self) -> ActorRef[Self]:
        """This actor's ref, for telling itself or handing itself to others."""
        if self._actor_ref is None:
            raise RuntimeError(f"{type(self).__name__} has no ref before start()")
        return self._actor_ref

    @property
    def actor_urn(self) -> str:
        """This actor's unique id (see ``ActorRegistry.get_by_urn``)."""
        return self.actor_ref.actor_urn

    def __str__(self) -> str:
        if self._actor_ref is None:
            return f"{type(self).__name__} (not started)"
        return f"{type(self).__name__} ({self._actor_ref.actor_urn})"

    async def on_start(self) -> None:
        """Prepare the actor; runs before any message is handled.

        Raising aborts ``start``, which re-raises the exception.
        """

    async def on_stop(self) -> None:
        """Release what the actor holds; runs once, after the last handler finished
        or was cancelled by ``stop``. Exceptions are logged and otherwise ignored.
        """

    def on_drained(self) -> bool:
        """Whether to stop now that the mailbox is empty; called after the last queued
        message was handled, synchronously (nothing can arrive meanwhile).

        The default keeps the actor. An actor made on demand (see :meth:`spawn`)
        answers True when it holds nothing worth keeping: it stops there and
        then (``on_stop`` runs), and a later message goes to a new one.
        """
        return False

    async def on_failure(self, exc: Exception) -> None:
        """Handle an exception raised by ``on_receive`` for a *told* message.

        The default logs it. The actor keeps running afterwards; if this hook
        raises, the actor is considered broken and stops.
        """
        _log.error("%s failed to handle a told message", self, exc_info=exc)

    async def on_receive(self, message: object) -> Any:
        """Handle one message; the return value is the reply to an ``ask``.

        The default raises :class:`TypeError`, so end a ``match`` over the
        messages you handle with ``return await super().on_receive(message)``.
        """
        raise TypeError(f"{type(self).__name__} does not handle {message!r}")


def _registration(ref: ActorRef[Any]) -> dict[str, Callable[[], None]]:
    """The mailbox's register/unregister hooks for ``ref``: none for a class that is
    not listed in the registry (``registered = False``)."""
    if not ref.actor_class.registered:
        return {}
    return {
        "register": lambda: registry.register(ref),
        "unregister": lambda: registry.unregister(ref),
    }


def _wire(actor: A) -> tuple[ActorRef[A], Mailbox]:
    """A new actor's mailbox and ref (the ref attached to the actor)."""
    actor_class = type(actor)
    mailbox = Mailbox(actor, number=next(_URNS), linger=actor_class.linger_turns)
    ref = ActorRef(mailbox, actor_class)
    actor._actor_ref = ref
    return ref, mailbox
