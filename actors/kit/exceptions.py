"""The exceptions the actor core raises on its own behalf.

Every error that originates in ``actors/`` derives from :class:`ActorError`, so
a caller can catch "the runtime refused" without also catching the failures
that actor code raises (those reach an asker unchanged)::

    ActorError                 base: the actor machinery itself refused
    └── ActorDeadError         closed by us: the actor (or the runner) was
                               stopped before, or while, handling the message

Two things are deliberately *not* wrapped:

- an exception raised by ``on_receive`` for an ``ask`` is re-raised to the
  asker as-is, because it is the answer, not a runtime fault;
- an ``ask`` that runs out of time raises the builtin :class:`TimeoutError`
  from :func:`asyncio.timeout`, which is what every asyncio caller expects.

This hierarchy is separate from ``pykka.ActorDeadError``: the thread bridge
translates pykka's error into ours at the boundary, so callers on the event
loop only ever see this package's classes.
"""

from __future__ import annotations

__all__ = ["ActorDeadError", "ActorError"]


class ActorError(Exception):
    """Base class for errors raised by the actor runtime itself."""


class ActorDeadError(ActorError):
    """The actor was stopped, so the message was not (or not fully) handled.

    Raised by ``tell``/``ask`` on a stopped actor, set on every ask still
    queued or in flight when the actor stops, and raised by a closed
    :class:`~actors.BlockingExecutor`.
    """
