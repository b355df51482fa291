"""ActorRegistry: find running actors by urn or class, and stop them all.

Like pykka's registry it is a class of class methods, so any code can look an
actor up without a registry being passed around. Unlike pykka's it is not
process-global: each running event loop has its own table. Actors are bound to
the loop they were started on (their futures and tasks belong to it), so a
process-wide table could only hand out refs that are unusable on another loop;
a per-loop table also means a test's fresh loop starts with an empty registry.

Registration is done by the actor machinery, not by users: an actor is
registered once its ``on_start`` has returned (so nobody can find an actor
that is not ready) and unregistered the moment ``stop`` begins (so nobody
finds one that is refusing messages). An actor whose class sets
``registered = False`` is never listed: it is made on demand by an owner that
keeps its own directory of them and stops them itself (the supervisor's
session actors), so ``stop_all`` reaches it through that owner. Every method
must be called from a coroutine or callback running on the loop.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from actors.kit.ref import ActorRef

if TYPE_CHECKING:
    from actors.kit.actor import Actor

__all__ = ["ActorRegistry", "register", "unregister"]

A = TypeVar("A", bound="Actor")

# Weak keys: a closed and dropped loop takes its table with it.
_tables: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, ActorRef[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _table() -> dict[str, ActorRef[Any]]:
    return _tables.setdefault(asyncio.get_running_loop(), {})


def register(ref: ActorRef[Any]) -> None:
    """Add a started actor to its loop's registry (called by the actor machinery)."""
    _table()[ref.actor_urn] = ref


def unregister(ref: ActorRef[Any]) -> None:
    """Remove a stopping actor from its loop's registry (called by the actor machinery)."""
    _table().pop(ref.actor_urn, None)


class ActorRegistry:
    """The running actors of the current event loop, in the order they started."""

    def __init__(self) -> None:
        raise TypeError("ActorRegistry is used through its class methods")

    @classmethod
    def get_all(cls) -> list[ActorRef[Any]]:
        """Every registered actor, oldest first."""
        return list(_table().values())

    @classmethod
    def get_by_urn(cls, actor_urn: str) -> ActorRef[Any] | None:
        """The actor with this urn, or ``None`` if it is not running."""
        return _table().get(actor_urn)

    @classmethod
    def get_by_class(cls, actor_class: type[A]) -> list[ActorRef[A]]:
        """Every registered actor that is an instance of ``actor_class`` (subclasses too)."""
        return [ref for ref in _table().values() if issubclass(ref.actor_class, actor_class)]

    @classmethod
    async def stop_all(cls) -> None:
        """Stop every registered actor, newest first, each after the previous one stopped.

        Newest first because actors started later usually depend on those started
        earlier (sessions on the store writer, say) and may still use them from
        their ``on_stop``.
        """
        for ref in reversed(list(_table().values())):
            await ref.stop()
