"""ActorRef: the only handle other code holds on an asyncio actor.

A ref is what gets passed around, stored in the registry and put in messages;
the actor object itself stays private to its own drain task, which is what
makes "state is owned by exactly one actor" true. The surface copies pykka's
(``tell``, ``ask``, ``stop``, ``is_alive``) so one mental model covers both
the asyncio actors and the pykka threads at the blocking edge, with one
difference that matters: ``ask`` and ``stop`` are coroutines. A pykka ``ask``
blocks the calling thread, which on the event loop would stall every session.

All methods must be called on the actor's event loop. A thread that needs to
message an actor hops onto the loop first:
``loop.call_soon_threadsafe(ref.tell, message)``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from actors.kit.mailbox import Envelope, Mailbox

if TYPE_CHECKING:
    from actors.kit.actor import Actor

__all__ = ["ActorRef"]

A = TypeVar("A", bound="Actor", covariant=True)


class ActorRef(Generic[A]):
    """A handle for sending messages to, and stopping, one actor."""

    __slots__ = ("_mailbox", "actor_class")

    actor_class: type[A]
    """The class of the referenced actor."""

    def __init__(self, mailbox: Mailbox, actor_class: type[A]) -> None:
        self._mailbox = mailbox
        self.actor_class = actor_class

    @property
    def actor_urn(self) -> str:
        """A unique id of the actor in this process, as used by ``ActorRegistry.get_by_urn``.

        Made when asked (an actor made per command is rarely asked its name).
        """
        return self._mailbox.urn

    def __repr__(self) -> str:
        return f"<ActorRef {self.actor_class.__name__} ({self.actor_urn})>"

    def is_alive(self) -> bool:
        """Whether the actor still accepts messages (false once ``stop`` has begun)."""
        return self._mailbox.alive

    def tell(self, message: object) -> None:
        """Queue ``message`` and return at once, without waiting for it to be handled.

        Raises:
            ActorDeadError: the actor is stopped or stopping.
        """
        self._mailbox.put(Envelope(message))

    async def ask(self, message: object, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Send ``message`` and wait for the value ``on_receive`` returns for it.

        An exception raised by ``on_receive`` is raised here unchanged and the
        actor keeps running. If the asker stops waiting (timeout or cancellation)
        before the actor reaches the message, the message is skipped; if the
        handler had already started, it finishes and its result is dropped.

        Raises:
            ActorDeadError: the actor is stopped, or stopped before replying.
            TimeoutError: no reply within ``timeout`` seconds.
            RuntimeError: an actor asked itself from its own handler.
        """
        reply = self.request(message)
        # Being cancelled here (timeout included) cancels `reply`, which is how the
        # mailbox learns that nobody is waiting any more.
        if timeout is None:
            return await reply
        async with asyncio.timeout(timeout):
            return await reply

    def request(self, message: object) -> asyncio.Future[Any]:
        """Queue ``message`` as :meth:`ask` does and return its reply future at once.

        For an actor that forwards a request to another and hands the reply
        on without waiting for it (its own handler must never wait on
        another actor's answer). Cancelling the future before the message is
        reached withdraws it, as a cancelled ask does.

        Raises:
            ActorDeadError: the actor is stopped or stopping.
            RuntimeError: an actor asked itself from its own handler.
        """
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._mailbox.put(Envelope(message, reply))
        return reply

    async def stop(self) -> None:
        """Stop the actor: nothing more is handled, pending asks fail, ``on_stop`` runs once.

        Idempotent. Returns when ``on_stop`` has finished (from ``on_stop`` itself
        it returns at once). Called from the actor's own handler, the handler is
        cancelled at this ``await`` like any other handler in flight, so it is the
        last thing the handler does.

        Raises:
            RuntimeError: called during the actor's ``on_start`` (raise from it instead).
        """
        await self._mailbox.stop()
