"""The mailbox: where an actor's messages wait, and the task that drains them.

Design
------
An asyncio actor is a FIFO queue plus *at most one* drain task. The task is
spawned by the ``put`` that finds the actor idle and it exits as soon as it sees
the queue empty, so an idle actor holds no task at all: only a ``deque`` and a
few fields. A runtime keeps one actor per session, and most sessions are idle
most of the time; a permanent receive loop per actor would cost a task, a
suspended frame and a wake-up each, for nothing.

An actor may *linger* (``Actor.linger_turns``): its drain task, finding the
queue empty, waits that many loop turns (a ``sleep(0)`` each; the count starts
again only after a message is handled) before it ends, and handles a message
put meanwhile itself. A caller that sends its next command as soon as the last
one was answered then costs neither a new task nor, for an actor that retires
when drained, a new actor. The wait is the drain task's own, so it is bounded
by the turns and cancelled with the task by ``stop()``.

Ordering holds because there is never more than one drain task: ``put`` only
spawns one when none exists, and the running one decides "queue empty, exit"
and clears its slot without an ``await`` in between, so no message can slip
past it or be handled by two tasks at once. Messages are handled one at a time,
so ``on_receive`` never runs concurrently with itself.

The drain task is not started in an :class:`asyncio.TaskGroup` because a group
needs a parent task that lives as long as the actor, which is exactly what this
design avoids. Instead the mailbox owns its tasks: it holds the only reference
to the drain task and to the stop task, and stopping cancels and awaits them, so
nothing the mailbox creates outlives the actor.

Error policy
------------
- ``ask``: whatever ``on_receive`` raises is set on the asker's future and
  raised to the asker unchanged; it is the answer, so ``on_failure`` is not
  called and the actor keeps running.
- ``tell``: nobody is waiting, so the exception goes to ``on_failure(exc)``
  and the actor keeps running with the next message.
- ``on_failure`` itself raising means the actor's own error handling is
  broken: that is the one fatal case. It is logged and the actor stops (an
  orderly stop: queued asks fail with ``ActorDeadError``, ``on_stop`` runs).
- ``on_stop`` raising is logged; the actor is stopped regardless.
- An ask whose asker gave up (timeout or cancellation) before the actor
  reached it is skipped. Once a handler has started it runs to completion and
  its result is dropped: cancelling an asker never cancels the actor.

Context
-------
The drain task runs in a context of its own (empty), never a copy of the
sender's: a handler must not see the context variables of whichever caller
happened to wake the actor (a drain's lease fence would otherwise mark the
writes of every message the task handles after it).

Fairness
--------
A drain lets the rest of the loop run after :data:`SLICE_S` of CPU spent on its
messages, when more are queued: handlers that never suspend would otherwise
run back to back in one callback, the loop held for the whole backlog (issue
#42 section 1: no callback over 5 ms). Order is unchanged; the one drain task
just resumes on the loop's next turn.

Stopping
--------
``stop()`` closes the mailbox at once (``tell``/``ask`` raise
``ActorDeadError``), unregisters the actor, fails every queued ask with
``ActorDeadError``, cancels the handler in flight (its asker gets
``ActorDeadError``), then runs ``on_stop`` exactly once. That work runs in a
dedicated stop task which every ``stop()`` caller awaits through
:func:`asyncio.shield`: a cancelled caller must not cut ``on_stop`` short, and
a handler that stops its own actor must not wait for itself (it is cancelled
at that ``await`` instead, like any other handler in flight).

An actor whose ``on_drained`` answers True stops itself as soon as its queue
runs dry (after its linger, if any), in its drain task and without an
``await`` before the mailbox closes, so nothing put afterwards can be lost: it
raises ``ActorDeadError`` and the sender makes a new actor (actors made on
demand, one per session, which :meth:`Actor.spawn` starts without an ``await``).

Cancellation subtleties
-----------------------
A ``CancelledError`` out of ``on_receive`` means two different things. If the
drain task itself is being cancelled (``Task.cancelling()`` is non-zero) it
propagates; if the handler merely awaited something that was cancelled, it is
an ordinary failure of that message, converted to :class:`ActorError` so an
asker does not mistake it for its own cancellation. The drain task is private,
so only ``stop()`` or the loop's own shutdown cancels it. The second is not an
orderly stop (an idle actor would get none either, having no task to cancel):
the actor is marked dead and its asks fail, but ``on_stop`` does not run and no
new task is created that could outlive the loop. Stop actors (for instance with
``ActorRegistry.stop_all()``) before the loop ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from actors.kit.exceptions import ActorDeadError, ActorError

__all__ = ["Envelope", "Hooks", "Mailbox"]

_log = logging.getLogger("actors")


class Hooks(Protocol):
    """What the mailbox calls on the actor; :class:`actors.Actor` satisfies it."""

    async def on_start(self) -> None: ...

    async def on_stop(self) -> None: ...

    async def on_failure(self, exc: Exception) -> None: ...

    def on_drained(self) -> bool: ...

    async def on_receive(self, message: object) -> Any: ...


class Envelope:
    """A message in the queue; ``reply`` is set for an ask, ``None`` for a tell.

    A plain slotted class (one is made per message; an attrs frozen one took
    three times as long to make), never changed after it is made.
    """

    __slots__ = ("message", "reply")

    def __init__(self, message: object, reply: asyncio.Future[Any] | None = None) -> None:
        self.message = message
        self.reply = reply


class _State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _cancelling() -> bool:
    """Whether the current task has a cancellation pending (vs. a stray CancelledError)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Stopped:
    """The hooks of an actor that has stopped (never called: the mailbox is closed)."""

    async def on_start(self) -> None:
        raise RuntimeError("the actor has stopped")

    async def on_stop(self) -> None:
        raise RuntimeError("the actor has stopped")

    async def on_failure(self, exc: Exception) -> None:
        raise RuntimeError("the actor has stopped")

    def on_drained(self) -> bool:
        return False

    async def on_receive(self, message: object) -> Any:
        raise RuntimeError("the actor has stopped")


_STOPPED: Final = _Stopped()

#: CPU (the loop thread's) a drain spends on queued messages before it yields
#: to the loop once (see "Fairness" in the module docstring).
SLICE_S: Final = 0.002


def _fail(reply: asyncio.Future[Any] | None, error: BaseException) -> None:
    if reply is not None and not reply.done():
        reply.set_exception(error)


#: Drain task names by actor class: one string per class, not one formatted per
#: task (a drain task is made per command for an actor made per command).
_drain_names: dict[type, str] = {}


def _drain_name(kind: type) -> str:
    name = _drain_names.get(kind)
    if name is None:
        name = _drain_names[kind] = f"drain {kind.__name__}"
    return name


class Mailbox:
    """One actor's queue, its drain task and its lifecycle state.

    All methods must be called on the event loop the mailbox was created on.
    """

    def __init__(self, actor: Hooks, *, number: int, linger: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        self._actor = actor
        #: For the actor's urn and name, made when first asked (see :attr:`urn`).
        self._kind = type(actor)
        self._number = number
        self._linger = linger
        self._queue: deque[Envelope] = deque()
        self._state = _State.STARTING
        #: True from start until stop begins (STARTING or RUNNING): read on every
        #: put, so a field kept with the state rather than a property.
        self.alive = True
        self._drain: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None
        # The task currently running this actor's code (on_start or the drain task);
        # an ask from it to its own actor could never be answered.
        self._owner: asyncio.Task[Any] | None = None
        self._unregister: Callable[[], None] | None = None

    @property
    def urn(self) -> str:
        """The actor's id, unique in this process (the registry's scope)."""
        return f"urn:sessionrt:actor:{self._number}"

    @property
    def _name(self) -> str:
        return f"{self._kind.__name__} ({self.urn})"

    def __repr__(self) -> str:
        return f"<Mailbox {self._name} {self._state.value}, {len(self._queue)} queued>"

    def put(self, envelope: Envelope) -> None:
        """Queue a message and make sure a drain task will handle it."""
        if asyncio._get_running_loop() is not self._loop:
            self._check_loop()  # raises
        if not self.alive:
            raise ActorDeadError(f"{self._name} is stopped")
        owner = self._owner
        if envelope.reply is not None and owner is not None and asyncio.current_task() is owner:
            raise RuntimeError(f"{self._name} asked itself; that can never be answered, use tell")
        self._queue.append(envelope)
        if self._state is _State.RUNNING and self._drain is None:
            self._start_drain()

    async def start(
        self,
        *,
        register: Callable[[], None] | None = None,
        unregister: Callable[[], None] | None = None,
    ) -> None:
        """Run ``on_start`` in the caller's task, then accept messages.

        If ``on_start`` raises (or the caller is cancelled) the actor is dead
        before it was ever registered: the exception propagates, ``on_stop`` does
        not run, and anything ``on_start`` told itself is dropped.
        """
        self._owner = asyncio.current_task()
        try:
            await self._actor.on_start()
        except BaseException:
            self._state = _State.STOPPED
            self.alive = False
            self._drop_queued(f"{self._name} failed to start")
            raise
        finally:
            self._owner = None
        self.open(register=register, unregister=unregister)

    def open(
        self,
        *,
        register: Callable[[], None] | None = None,
        unregister: Callable[[], None] | None = None,
    ) -> None:
        """Register (if given) and accept messages (after ``on_start``; at once for an
        actor without one), handling those ``on_start`` told itself."""
        self._unregister = unregister
        if register is not None:
            register()
        self._state = _State.RUNNING
        if self._queue:
            self._start_drain()

    def _start_drain(self) -> None:
        self._drain = self._owner = self._loop.create_task(
            self._drain_queue(), name=_drain_name(self._kind), context=contextvars.Context()
        )

    async def stop(self) -> None:
        """Stop the actor (see the module docstring); idempotent, concurrent-safe."""
        self._check_loop()
        if self._state is _State.STARTING:
            raise RuntimeError(f"{self._name} cannot stop during on_start; raise from it instead")
        if self._state is _State.STOPPED or asyncio.current_task() is self._closer:
            return  # stopped, or called from on_stop, which must not wait for itself
        self._begin_stop()
        if self._closer is None:
            self._closer = self._loop.create_task(self._close(), name=f"stop {self._name}")
        await asyncio.shield(self._closer)

    def _check_loop(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            raise RuntimeError(
                f"{self._name} belongs to another event loop; from a thread use "
                "loop.call_soon_threadsafe(ref.tell, message)"
            )

    async def _drain_queue(self) -> None:
        try:
            clock = time.thread_time
            start = clock()
            turns = self._linger
            while self._state is _State.RUNNING:
                if self._queue:
                    envelope = self._queue.popleft()
                    reply = envelope.reply
                    if reply is not None and reply.done():
                        continue  # the asker timed out or was cancelled before we got here
                    # The handler is awaited here, not in a helper: one frame fewer
                    # for each of its awaits to pass through.
                    try:
                        result = await self._actor.on_receive(envelope.message)
                    except (Exception, asyncio.CancelledError) as exc:
                        await self._failed(envelope, exc)
                    else:
                        if reply is not None and not reply.done():
                            reply.set_result(result)
                    turns = self._linger
                    if self._queue and clock() - start >= SLICE_S:
                        # A backlog of handlers that never suspend (the supervisor's,
                        # when 100 sessions kick at once) ran in one callback: 5-10 ms
                        # of CPU with the loop held. Let the rest of the loop run.
                        await asyncio.sleep(0)
                        start = clock()
                elif turns:
                    # Empty: wait a loop turn (bounded, this task's own) for a message
                    # put meanwhile, which this task then handles: no new task, and an
                    # actor that retires when drained is not made again for it.
                    turns -= 1
                    await asyncio.sleep(0)
                    start = clock()
                else:
                    if self._actor.on_drained():
                        # Stopping itself, empty: closed before anything else can be put.
                        self._begin_stop()
                        self._closer = self._drain  # a stop() meanwhile waits for this task
                        await self._finish()
                    break
        except asyncio.CancelledError:
            if self._state is _State.RUNNING:
                # stop() flips the state before cancelling, so this is the loop shutting down
                # under a live actor. That is not an orderly stop (idle actors get none either),
                # so leave a consistent dead actor behind and no new task to outlive the loop.
                self._begin_stop()
                self._state = _State.STOPPED
            raise
        finally:
            self._drain = None
            self._owner = None

    async def _failed(self, envelope: Envelope, exc: Exception | asyncio.CancelledError) -> None:
        """``on_receive`` raised ``exc`` for ``envelope``: the error policy (see the module
        docstring). Re-raises a cancellation of the drain task itself."""
        reply = envelope.reply
        error: Exception
        if isinstance(exc, asyncio.CancelledError):
            if _cancelling():
                what = type(envelope.message).__name__
                _fail(reply, ActorDeadError(f"{self._name} stopped while handling {what}"))
                raise exc
            error = ActorError(f"{self._name}: handler raised CancelledError")
            error.__cause__ = exc
        else:
            error = exc
        if reply is not None:
            _fail(reply, error)
            return
        try:
            await self._actor.on_failure(error)
        except asyncio.CancelledError:
            if _cancelling():
                raise
            self._fatal()
        except Exception:
            self._fatal()

    def _fatal(self) -> None:
        _log.exception("%s: on_failure raised; stopping the actor", self._name)
        self._begin_stop()
        # The drain task is the caller; it returns as soon as it sees the new state.
        if self._closer is None:
            self._closer = self._loop.create_task(self._close(), name=f"stop {self._name}")

    def _begin_stop(self) -> None:
        """Close the mailbox to new messages and fail those still queued."""
        if not self.alive:
            return
        self._state = _State.STOPPING
        self.alive = False
        # The unregistering closure holds the ref, which holds this mailbox.
        unregister, self._unregister = self._unregister, None
        if unregister is not None:
            unregister()
        if self._queue:
            self._drop_queued(f"{self._name} stopped before handling the message")

    def _drop_queued(self, reason: str) -> None:
        dropped, self._queue = self._queue, deque()
        for envelope in dropped:
            _fail(envelope.reply, ActorDeadError(reason))

    async def _close(self) -> None:
        drain = self._drain
        if drain is not None:
            drain.cancel()
            # wait() rather than await: the drain task ends cancelled, which is not our error.
            await asyncio.wait({drain})
            self._drain = None
        await self._finish()

    async def _finish(self) -> None:
        try:
            await self._actor.on_stop()
        except Exception:
            _log.exception("%s: on_stop raised", self._name)
        finally:
            self._state = _State.STOPPED
            # Nothing calls the actor any more: let go of it (it holds its ref,
            # which holds this mailbox) and of the task running this (which
            # holds this mailbox too), so a stopped actor is freed at once,
            # not at the next pass of the cyclic collector. Whoever awaits the
            # stop holds the task.
            self._actor = _STOPPED
            self._closer = None
