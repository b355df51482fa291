"""The actor runtime's core: asyncio actors, and pykka threads for blocking work.

- :class:`Actor`, :class:`ActorRef`, :class:`ActorRegistry`: actors on the
  event loop, each a mailbox drained by a task that exists only while there is
  something to handle (``_actor``, ``_mailbox``, ``_ref``, ``_registry``).
- :class:`BlockingExecutor`: short blocking helpers that are not tool calls
  (catalogue reads, attachments, makedirs) on a bounded thread pool
  (``_blocking``). Tool calls are pykka child actors: :mod:`actors.tools`.
- :class:`ActorError`, :class:`ActorDeadError`: what the runtime raises on its
  own behalf (``_exceptions``).
"""

from actors._actor import Actor
from actors._blocking import BlockingExecutor
from actors._exceptions import ActorDeadError, ActorError
from actors._ref import ActorRef
from actors._registry import ActorRegistry

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorError",
    "ActorRef",
    "ActorRegistry",
    "BlockingExecutor",
]
