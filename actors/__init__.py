"""The actor runtime: sessions, tools and models on asyncio actors.

The actor kit itself (:class:`Actor`, :class:`ActorRef`, :class:`ActorRegistry`,
:class:`BlockingExecutor`, :class:`ActorError`, :class:`ActorDeadError`) lives
in :mod:`actors.kit` and is re-exported here.
"""

from actors.kit import (
    Actor,
    ActorDeadError,
    ActorError,
    ActorRef,
    ActorRegistry,
    BlockingExecutor,
)

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorError",
    "ActorRef",
    "ActorRegistry",
    "BlockingExecutor",
]
