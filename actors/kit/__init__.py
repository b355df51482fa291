"""The actor kit: asyncio actors, and the small concurrency tools around them.

Nothing here knows about sessions; everything else in ``actors/`` builds on it.

- :class:`Actor`, :class:`ActorRef`, :class:`ActorRegistry`: actors on the
  event loop, each a mailbox drained by a task that exists only while there is
  something to handle (``actor``, ``mailbox``, ``ref``, ``registry``).
- :class:`ActorError`, :class:`ActorDeadError`: what the kit raises on its own
  behalf (``exceptions``).
- :class:`BlockingExecutor`, :func:`wait_out`, :func:`wait_all`: short blocking
  helpers that are not tool calls on a bounded thread pool, and waiting for
  threads without blocking the loop (``blocking``). Tool calls are pykka child
  actors: :mod:`actors.tools`.
- :func:`finish`: work that a cancellation must not cut in half (``shield``).
"""

from actors.kit.actor import Actor
from actors.kit.blocking import BlockingExecutor, wait_all, wait_out
from actors.kit.exceptions import ActorDeadError, ActorError
from actors.kit.ref import ActorRef
from actors.kit.registry import ActorRegistry
from actors.kit.shield import finish

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorError",
    "ActorRef",
    "ActorRegistry",
    "BlockingExecutor",
    "finish",
    "wait_all",
    "wait_out",
]
