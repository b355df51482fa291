"""Tool calls run on call actors: long-lived pykka actors, each with its worker thread, pooled.

The shape (ARCHITECTURE §2, "pykka at the blocking edge")::

    step (ToolCalls) ── owns ──> ToolOwner ── adopts ──> ToolChild  (loop side, one per call)
                                                           │ Cancel
                                                           ▼
        ToolActors ── owns, at most ``limit`` ──> ToolCallActor     (its own thread, free)
                 │                                         │ owns: starts, joins
                 │ Run (a queue put)                       ▼
                 └───────────────────────────────> its worker thread (runs one call at a time)
                                                           │ Progress, then the outcome
                                                           ▼
                                               back on the loop (call_soon_threadsafe)

A call actor's own thread only handles messages; the tool's blocking work
runs on the worker thread the actor owns. So the actor hears ``Cancel`` (and
a stop) *while the tool works*, and acts on it at once: it sets the call's
:class:`~actors.tools.CancelEvent`, which wakes the tool where it waits
(bash's selector holds the event's descriptor beside its output pipe, and
kills the process group; a file loop checks it per entry).

The actors and their workers outlive a call: the pool hands an idle one to
the next call. Starting and joining two threads per call cost more than the
tool's own work for a small call (issue 37: 1.33x per call against the
single-thread shape), so they are started once, the first time the pool
needs one more, and joined once, when the pool closes.

- **Run**: the pool assigns the call to an idle actor and puts it on that
  actor's worker queue; the worker runs the tool, bounds a success (one
  region: a success is never handed back unbounded) and hands the outcome to
  the loop itself. A call whose cancel event is set before the worker takes
  it does not run the tool.
- **Cancel** names its call: the actor sets that call's cancel event only if
  the call is the one assigned to it now, so a late Cancel for an earlier
  call never reaches the next one (each call has its own event as well).
- **stop** (pykka's, e.g. someone's ``ActorRegistry.stop_all()``, or the
  pool's on close): cancel the assigned call, let the worker finish it (what
  it produced is the settlement), end the worker and join it. The pool drops
  a stopped actor and starts another when it needs one.
- **Progress**: ``ctx.progress`` on the worker becomes a :class:`Progress`
  message to the owner, on the loop.
- **Failure**: an exception that escapes the tool (anything but
  :class:`ToolError`) is logged and settles the call as ``tool.error``; the
  actor and its worker live on for the next call.
- **Ownership**: the step's :class:`ToolOwner` holds its children;
  :meth:`ToolOwner.stop` cancels every one and returns once each has
  reported. The step waits for that before its own terminal, so no call
  outlives its step. :class:`ToolActors` owns every call actor: ``aclose``
  stops each (which joins its worker) and joins each actor's thread on the
  runtime's blocking executor.

Bounded by count: at most ``limit`` calls at once (``[runtime]
max_tool_threads``; a call waits for a slot), so at most ``limit`` live call
actors, two threads each. Actors stopped from outside are replaced; their
threads, already ending, are joined at close (kept until then only while
still alive). The loop never waits on a pykka future: it only ``tell``s and
puts on a queue; it starts an actor's two threads only when the pool grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

import attrs
import pykka

from actors.kit import ActorDeadError, BlockingExecutor, wait_all, wait_out
from actors.tools._types import CancelEvent, SucceededThenInterrupted, ToolOutcome
from protocol.lifecycle import Lifecycle, LifecycleState

__all__ = [
    "Cancel",
    "Progress",
    "Run",
    "ToolActors",
    "ToolCallActor",
    "ToolChild",
    "ToolOwner",
]

logger = logging.getLogger(__name__)

#: The call's work: run the tool, bound a success; runs on a call actor's worker thread.
Work = Callable[[], ToolOutcome]


@attrs.frozen(kw_only=True)
class Cancel:
    """Stop this call early (its owner is stopping, or it was interrupted)."""

    child: ToolChild


@attrs.frozen(kw_only=True)
class Progress:
    """A running call's latest progress metadata, for its owner."""

    call_id: str
    metadata: Mapping[str, Any]


@attrs.frozen(kw_only=True, eq=False)
class Run:
    """For a worker: run this call's work, hand its outcome to ``loop``."""

    child: ToolChild
    work: Work
    loop: asyncio.AbstractEventLoop


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """Run ``callback(*args)`` on ``loop`` (thread side)."""
    # RuntimeError: the loop is closed, and with it whoever was waiting; nothing to tell.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown failure"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class ToolChild:
    """The loop side of one call: its outcome, and the way to tell its actor Cancel."""

    def __init__(
        self,
        call_id: str,
        cancel: CancelEvent,
        done: asyncio.Future[ToolOutcome],
    ) -> None:
        self.call_id = call_id
        self.cancel = cancel
        self.done = done
        self._ref: pykka.ActorRef[ToolCallActor] | None = None
        self._cancelled = False

    def __repr__(self) -> str:
        state = "settled" if self.done.done() else "running"
        return f"<ToolChild {self.call_id} {state}>"

    def attached(self, ref: pykka.ActorRef[ToolCallActor]) -> None:
        """The pool assigned the call to this actor (on the loop)."""
        self._ref = ref
        if self._cancelled:
            self._tell_cancel()

    def request_cancel(self) -> None:
        """Tell the call's actor Cancel (once it has one: at once, else when it does)."""
        self._cancelled = True
        self._tell_cancel()

    def _tell_cancel(self) -> None:
        if self._ref is not None and not self.done.done():
            # A stopped actor has cancelled its assigned call itself.
            with contextlib.suppress(pykka.ActorDeadError):
                self._ref.tell(Cancel(child=self))


class ToolOwner:
    """A step's books of its calls; stopping it stops them all.

    ``on_progress`` receives every call's :class:`Progress`, on the loop.
    """

    def __init__(self, on_progress: Callable[[Progress], None] | None = None) -> None:
        self._on_progress = on_progress
        self._children: dict[ToolChild, None] = {}

    def __repr__(self) -> str:
        return f"<ToolOwner {len(self._children)} children>"

    @property
    def children(self) -> tuple[ToolChild, ...]:
        """The calls that have not reported yet, oldest first."""
        return tuple(self._children)

    def adopt(self, child: ToolChild) -> None:
        self._children[child] = None

    def release(self, child: ToolChild) -> None:
        self._children.pop(child, None)

    def progress(self, message: Progress) -> None:
        """A call's progress (on the loop)."""
        if self._on_progress is not None:
            self._on_progress(message)

    def reporter(self, call_id: str) -> Callable[[Mapping[str, Any]], None]:
        """``ctx.progress`` for a call: thread side, hops to the loop as a Progress."""
        loop = asyncio.get_running_loop()

        def report(metadata: Mapping[str, Any]) -> None:
            message = Progress(call_id=call_id, metadata=dict(metadata))
            _post(loop, lambda: self.progress(message))

        return report

    async def stop(self) -> None:
        """Cancel every call and wait until each one has reported its outcome.

        A cancellation of the caller does not cut the wait short; it is
        re-raised once every call has reported.
        """
        children = list(self._children)
        for child in children:
            child.request_cancel()
        await wait_all([child.done for child in children])


class _Worker:
    """A call actor's worker thread: runs the calls put on its queue, one at a time.

    ``assigned`` is the call the pool gave the actor (written on the loop,
    read by the actor); the queue holds at most one :class:`Run` and then the
    end marker, which ``close`` puts under the lock so that nothing follows it.
    """

    def __init__(self, name: str) -> None:
        self.assigned: ToolChild | None = None
        self._queue: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        # Daemon: a pool left open must not keep the process alive; aclose joins it.
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, run: Run) -> bool:
        """Queue ``run``; False if the worker is closed (it will never run it)."""
        with self._lock:
            if self._closed:
                return False
            self._queue.put(run)
            return True

    def close(self) -> None:
        """Finish what is queued, then end (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)

    def _serve(self) -> None:
        while (run := self._queue.get()) is not None:
            _post(run.loop, _resolve, run.child.done, _outcome(run))


def _outcome(run: Run) -> ToolOutcome:
    """Run the call's work on the worker; whatever escapes it is the call's failure."""
    if run.child.cancel.is_set():
        return ToolOutcome.failure("aborted", "Tool execution aborted before it started")
    try:
        return run.work()
    except Exception as exc:
        logger.exception("tool call %s raised", run.child.call_id)
        return ToolOutcome.failure("tool.error", _describe(exc))
    except BaseException as exc:
        # SystemExit & co.: this call's failure, not the worker's end.
        logger.error("tool call %s raised %s", run.child.call_id, type(exc).__name__)
        return ToolOutcome.failure("tool.error", f"the tool raised {_describe(exc)}")


class ToolCallActor(pykka.ThreadingActor):
    """A call actor: its worker runs the calls it is given; its own thread hears Cancel and stop."""

    # It holds no work between calls; a pool left open must not keep the process alive.
    use_daemon_thread = True

    def __init__(
        self,
        worker: _Worker,
        loop: asyncio.AbstractEventLoop,
        stopped: asyncio.Future[threading.Thread],
    ) -> None:
        super().__init__()
        self._worker = worker
        self._loop = loop
        self._stopped = stopped

    def on_receive(self, message: Any) -> None:
        match message:
            case Cancel(child=child):
                if child is self._worker.assigned:
                    child.cancel.set()
            case _:
                super().on_receive(message)

    def on_stop(self) -> None:
        self._end()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._end()  # on_stop will not run

    def _end(self) -> None:
        """Cancel the assigned call, let the worker finish it and end; join it."""
        worker = self._worker
        worker.close()
        child = worker.assigned
        if child is not None:
            child.cancel.set()
        worker.thread.join()  # its call, if any, has reported
        _post(self._loop, _resolve, self._stopped, threading.current_thread())


@attrs.frozen(kw_only=True, eq=False)
class _Slot:
    """The pool's books of one call actor."""

    ref: pykka.ActorRef[ToolCallActor]
    worker: _Worker
    #: The actor's own thread, once it has stopped (and joined its worker).
    stopped: asyncio.Future[threading.Thread]

    @property
    def usable(self) -> bool:
        return not self.worker.closed and self.ref.is_alive()


class ToolActors:
    """Runs tool calls on pooled call actors, at most ``limit`` at once; one per runtime.

    An async context manager: ``aclose`` cancels every call still running,
    waits for each to report, stops every call actor (each joins its worker)
    and joins each actor's thread on ``blocking``. Use it from one event loop.
    """

    def __init__(self, *, blocking: BlockingExecutor, limit: int = 16) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._limit = limit
        self._blocking = blocking
        self._slots = asyncio.Semaphore(limit)
        self._lifecycle = Lifecycle("ToolActors")
        #: Every call actor started and not yet joined: at most ``limit`` usable ones.
        self._actors: dict[_Slot, None] = {}
        #: The usable ones not running a call, the most recently used last.
        self._idle: list[_Slot] = []
        self._running: dict[ToolChild, None] = {}
        self._started = 0

    def __repr__(self) -> str:
        state, running = self._lifecycle.state.value, len(self._running)
        return f"<ToolActors {state}, {running}/{self._limit} running, {self.actors} actors>"

    @property
    def limit(self) -> int:
        """The most calls (and call actors, two threads each) at once."""
        return self._limit

    @property
    def running(self) -> int:
        """Calls started and not yet reported."""
        return len(self._running)

    @property
    def actors(self) -> int:
        """Call actors started and not yet joined (idle, busy, or stopped from outside)."""
        return len(self._actors)

    @property
    def started(self) -> int:
        """Call actors started since the pool opened."""
        return self._started

    async def __aenter__(self) -> Self:
        self._lifecycle.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel running calls, wait for their reports, stop and join every call actor.

        Idempotent. Returns once every thread the pool started has ended:
        each worker (joined by its actor as it stops) and each actor's own
        (joined on the blocking executor).
        """
        if self._lifecycle.close() is not LifecycleState.OPEN:
            return
        children = list(self._running)
        for child in children:
            child.request_cancel()
        await wait_all([child.done for child in children])
        slots, self._idle = list(self._actors), []
        self._actors.clear()
        for slot in slots:
            _ = slot.ref.stop(block=False)  # never .get() on the loop; a no-op if stopped
        await wait_all([slot.stopped for slot in slots])
        threads = [slot.stopped.result() for slot in slots]
        await self._blocking.run(lambda: _join_all(threads))

    async def run(
        self,
        work: Work,
        *,
        call_id: str,
        cancel: CancelEvent,
        owner: ToolOwner | None = None,
    ) -> ToolOutcome:
        """Run ``work`` on an idle call actor, the call adopted by ``owner``; return its outcome.

        If the awaiting task is cancelled, the call is cancelled and ``run``
        waits for its report before re-raising: as
        :class:`~actors.tools.SucceededThenInterrupted` when the call had
        succeeded anyway (its outcome is the settlement), else as a plain
        ``CancelledError``.

        Raises:
            ActorDeadError: the pool is closed (or closed while this call waited).
            RuntimeError: the pool was never opened.
        """
        self._check_open()
        async with self._slots:
            self._check_open()
            loop = asyncio.get_running_loop()
            child = ToolChild(call_id, cancel, loop.create_future())
            try:
                slot = self._assign(Run(child=child, work=work, loop=loop))
            except Exception as exc:  # e.g. "can't start new thread"
                return ToolOutcome.failure("tool.error", f"Could not start the tool: {exc}")
            self._running[child] = None
            if owner is not None:
                owner.adopt(child)
            try:
                try:
                    # wait(), not await: cancelling us must not cancel the outcome.
                    await asyncio.wait({child.done})
                except asyncio.CancelledError:
                    child.request_cancel()
                    await wait_out(child.done)
                    outcome = child.done.result()
                    if outcome.status == "success":
                        raise SucceededThenInterrupted(outcome) from None
                    raise
                return child.done.result()
            finally:
                del self._running[child]
                if owner is not None:
                    owner.release(child)
                self._give_back(slot)

    def _assign(self, run: Run) -> _Slot:
        """Give ``run`` to an idle call actor, starting one if none is idle (holds a slot)."""
        while True:
            slot = self._idle.pop() if self._idle else self._start(run.loop)
            slot.worker.assigned = run.child
            if slot.worker.submit(run):
                run.child.attached(slot.ref)
                return slot
            slot.worker.assigned = None
            self._forget_ended()  # it was stopped from outside: its worker takes nothing more

    def _start(self, loop: asyncio.AbstractEventLoop) -> _Slot:
        n = self._started = self._started + 1
        worker = _Worker(f"tool-worker-{n}")
        worker.thread.start()
        stopped: asyncio.Future[threading.Thread] = loop.create_future()
        try:
            ref = ToolCallActor.start(worker, loop, stopped)
        except BaseException:
            worker.close()
            worker.thread.join()  # it was idle: it ends at once
            raise
        slot = _Slot(ref=ref, worker=worker, stopped=stopped)
        self._actors[slot] = None
        return slot

    def _give_back(self, slot: _Slot) -> None:
        slot.worker.assigned = None
        if self._lifecycle.state is LifecycleState.OPEN and slot.usable:
            self._idle.append(slot)
        else:
            self._forget_ended()

    def _forget_ended(self) -> None:
        """Drop the call actors stopped from outside whose threads have ended: only
        live threads need a join.

        One still ending stays on the books: aclose joins it.
        """
        for other in [s for s in self._actors if s.stopped.done()]:
            if not other.stopped.result().is_alive():
                del self._actors[other]

    def _check_open(self) -> None:
        if self._lifecycle.state is LifecycleState.UNOPENED:
            raise RuntimeError("ToolActors is not open; use 'async with ToolActors()'")
        if self._lifecycle.state is LifecycleState.CLOSED:
            raise ActorDeadError("ToolActors is closed")


def _join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()
