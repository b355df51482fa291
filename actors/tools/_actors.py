"""Tool calls as child actors: one pykka ``ThreadingActor`` per local call, owned by its step.

The shape (ARCHITECTURE §2, "pykka at the blocking edge")::

    step (ToolCalls) ── owns ──> ToolOwner ── adopts ──> ToolChild  (loop side)
                                                           │ Run / Cancel
                                                           ▼
                                                   ToolCallActor    (its own thread, free)
                                                           │ starts, joins
                                                           ▼
                                                   the call's worker thread (the tool)
                                                           │ Progress, then the outcome
                                                           ▼
                                               back on the loop (call_soon_threadsafe)

The actor's own thread only handles messages; the tool's blocking work runs
on a worker thread the actor starts on Run and joins before it reports. So
the actor hears ``Cancel`` (and a stop) *while the tool works*, and acts on
it at once: it sets the call's :class:`~actors.tools.CancelEvent`, which
wakes the tool where it waits (bash's selector holds the event's descriptor
beside its output pipe, and kills the process group; a file loop checks it
per entry). One thread per call more than running the tool on the actor's
thread, and no pool shared between calls: a call's thread is its own, ends
with it, and nothing of one call can hold up another.

- **Run**: start the worker: it runs the tool and bounds a success (one
  region: a success is never handed back unbounded), then tells the actor
  ``_Done``. A child whose call is already cancelled when Run arrives does
  not run the tool.
- **Cancel**: set the call's cancel event (the owner is stopping, or the call
  was interrupted); also heard by a child that has not reached Run yet.
- **stop** (pykka's, e.g. someone's ``ActorRegistry.stop_all()``): cancel
  the tool and wait for the worker; what it produced is the settlement.
- **Progress**: ``ctx.progress`` on the worker becomes a :class:`Progress`
  message to the owner, on the loop.
- **Failure**: an exception that escapes the tool (anything but
  :class:`ToolError`) is re-raised by the actor when it hears ``_Done``: the
  actor's failure; pykka calls ``on_failure``, which settles the call as
  ``tool.error``. A child stopped before it ran settles as ``aborted``.
  Every child reports exactly once, from ``on_stop`` or ``on_failure``, after
  its worker has ended and pykka has unregistered it.
- **Ownership**: the step's :class:`ToolOwner` holds its children;
  :meth:`ToolOwner.stop` cancels every one and returns once each has
  reported. The step waits for that before its own terminal, so no child
  outlives its step.

Threads are bounded: at most ``limit`` children exist at once (``[runtime]
max_tool_threads``, a limit on concurrent calls; a call waits for a slot
before its actor starts). The loop never starts or joins a thread itself:
one long-lived *spawner* actor per runtime starts each child and joins its
thread once it has reported, so the loop pays a ``queue.put`` per call; the
spawner's own thread is joined on the runtime's blocking executor when the
pool closes. The loop never waits on a pykka future either: it only ``tell``s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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

#: The child's work: run the tool, bound a success; runs on the child's worker thread.
Work = Callable[[], ToolOutcome]


@attrs.frozen
class Run:
    """Run your call now (told once, right after the child starts)."""


@attrs.frozen
class Cancel:
    """Stop early (the owner is stopping, or the call was interrupted)."""


@attrs.frozen(kw_only=True)
class Progress:
    """A running call's latest progress metadata, for its owner."""

    call_id: str
    metadata: Mapping[str, Any]


@attrs.frozen
class _Done:
    """From the child's worker to the child: the tool has returned (or raised)."""


@attrs.frozen(kw_only=True)
class _Ended:
    """From a child to the spawner: my thread is ending; join it."""

    thread: threading.Thread


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on ``loop`` (thread side)."""
    # RuntimeError: the loop is closed, and with it whoever was waiting; nothing to tell.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown failure"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ToolChild:
    """The loop side of one child actor: its call, its outcome, the way to tell it Cancel."""

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
        """The spawner started the actor (on the loop, posted by the spawner)."""
        self._ref = ref
        if self._cancelled:
            self._tell_cancel()

    def request_cancel(self) -> None:
        """Tell the actor Cancel (once it is attached: at once, else when it is)."""
        self._cancelled = True
        self._tell_cancel()

    def _tell_cancel(self) -> None:
        if self._ref is not None and not self.done.done():
            # The actor may be stopping on its own; it has reported (or will) either way.
            with contextlib.suppress(pykka.ActorDeadError):
                self._ref.tell(Cancel())


class ToolOwner:
    """A step's books of its child actors; stopping it stops them all.

    ``on_progress`` receives every child's :class:`Progress`, on the loop.
    """

    def __init__(self, on_progress: Callable[[Progress], None] | None = None) -> None:
        self._on_progress = on_progress
        self._children: dict[ToolChild, None] = {}

    def __repr__(self) -> str:
        return f"<ToolOwner {len(self._children)} children>"

    @property
    def children(self) -> tuple[ToolChild, ...]:
        """The children that have not reported yet, oldest first."""
        return tuple(self._children)

    def adopt(self, child: ToolChild) -> None:
        self._children[child] = None

    def release(self, child: ToolChild) -> None:
        self._children.pop(child, None)

    def progress(self, message: Progress) -> None:
        """A child's progress (on the loop)."""
        if self._on_progress is not None:
            self._on_progress(message)

    def reporter(self, call_id: str) -> Callable[[Mapping[str, Any]], None]:
        """``ctx.progress`` for a child: thread side, hops to the loop as a Progress."""
        loop = asyncio.get_running_loop()

        def report(metadata: Mapping[str, Any]) -> None:
            message = Progress(call_id=call_id, metadata=dict(metadata))
            _post(loop, lambda: self.progress(message))

        return report

    async def stop(self) -> None:
        """Cancel every child and wait until each one has reported its outcome.

        A cancellation of the caller does not cut the wait short; it is
        re-raised once every child has reported.
        """
        children = list(self._children)
        for child in children:
            child.request_cancel()
        await wait_all([child.done for child in children])


@attrs.frozen(kw_only=True)
class _Spawn:
    """For the spawner: start this child and tell it Run."""

    child: ToolChild
    work: Work
    loop: asyncio.AbstractEventLoop


class ToolCallActor(pykka.ThreadingActor):
    """One tool call: its worker runs the tool, its own thread hears Run, Cancel, stop."""

    def __init__(self, spawn: _Spawn, spawner: pykka.ActorRef[_Spawner]) -> None:
        super().__init__()
        self._spawn = spawn
        self._spawner = spawner
        self._worker: threading.Thread | None = None
        #: Written by the worker before it tells _Done; read after joining it.
        self._result: ToolOutcome | BaseException | None = None
        self._outcome = ToolOutcome.failure(
            "aborted", "Tool execution aborted: its actor was stopped before it ran"
        )
        self._reported = False

    def on_receive(self, message: Any) -> None:
        match message:
            case Run():
                if self._spawn.child.cancel.is_set():
                    self._outcome = ToolOutcome.failure(
                        "aborted", "Tool execution aborted before it started"
                    )
                    self.stop()
                    return
                self._worker = threading.Thread(
                    target=self._work, name=f"tool-{self._spawn.child.call_id}"
                )
                self._worker.start()
            case Cancel():
                self._spawn.child.cancel.set()
            case _Done():
                result = self._settle()
                if isinstance(result, BaseException):
                    raise result  # the actor's failure: on_failure settles the call
                # Reported from on_stop: the owner hears once this actor is unregistered.
                self.stop()
            case _:
                super().on_receive(message)

    def _work(self) -> None:
        """The worker thread: run the tool, keep what came of it, tell the actor."""
        try:
            self._result = self._spawn.work()
        except Exception as exc:
            self._result = exc
        except BaseException as exc:
            # SystemExit & co. would make pykka stop every actor in the process.
            error = RuntimeError(f"the tool raised {type(exc).__name__}")
            error.__cause__ = exc
            self._result = error
        # Stopped meanwhile: on_stop joins this thread and reads the result itself.
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(_Done())

    def _settle(self) -> ToolOutcome | BaseException | None:
        """Cancel a worker still running, join it, and take its result as the outcome."""
        worker, self._worker = self._worker, None
        if worker is not None:
            if worker.is_alive():
                self._spawn.child.cancel.set()
            worker.join()
        result, self._result = self._result, None
        if isinstance(result, ToolOutcome):
            self._outcome = result
        return result

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # pykka has logged the traceback and unregistered us; on_stop will not run.
        self._settle()
        self._outcome = ToolOutcome.failure("tool.error", _describe(exception_value))
        self._report()

    def on_stop(self) -> None:
        result = self._settle()
        if isinstance(result, BaseException):  # stopped while a failing tool ran
            self._outcome = ToolOutcome.failure("tool.error", _describe(result))
        self._report()

    def _report(self) -> None:
        if self._reported:
            return
        self._reported = True
        # Before the report: once every child has reported, the spawner has all
        # their threads to join (see ToolActors.aclose).
        with contextlib.suppress(pykka.ActorDeadError):
            self._spawner.tell(_Ended(thread=threading.current_thread()))
        done, outcome = self._spawn.child.done, self._outcome
        _post(self._spawn.loop, lambda: _resolve(done, outcome))


class _Spawner(pykka.ThreadingActor):
    """Starts one ``ToolCallActor`` per call and joins its thread once it ends.

    So thread starts and joins happen off the loop.
    """

    # It holds no work of its own; a pool left open must not keep the process alive.
    use_daemon_thread = True

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stopped: asyncio.Future[threading.Thread]
    ) -> None:
        super().__init__()
        self._loop = loop
        self._stopped = stopped

    def on_receive(self, message: Any) -> None:
        match message:
            case _Spawn():
                self._start(message)
            case _Ended(thread=thread):
                thread.join()  # it has reported: only its last lines are left
            case _:
                super().on_receive(message)

    def _start(self, spawn: _Spawn) -> None:
        try:
            ref = ToolCallActor.start(spawn, self.actor_ref)
            ref.tell(Run())
        except pykka.ActorDeadError:
            return  # stopped before it got Run: its on_stop has reported
        except Exception as exc:  # e.g. "can't start new thread"
            failed = ToolOutcome.failure("tool.error", f"Could not start the tool: {exc}")
            _post(self._loop, lambda: _resolve(spawn.child.done, failed))
            return
        _post(self._loop, lambda: spawn.child.attached(ref))

    def on_stop(self) -> None:
        # Every _Ended before the stop has been handled: each child's thread is joined.
        stopped, me = self._stopped, threading.current_thread()
        _post(self._loop, lambda: _resolve(stopped, me))


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class ToolActors:
    """Starts tool-call child actors, at most ``limit`` at once; one per runtime.

    An async context manager: ``__aenter__`` starts the spawner's thread;
    ``aclose`` cancels every child still running, waits for each to report,
    stops the spawner (which joins every child's thread) and joins the
    spawner's thread on ``blocking``. Use it from one event loop.
    """

    def __init__(self, *, blocking: BlockingExecutor, limit: int = 16) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._limit = limit
        self._blocking = blocking
        self._slots = asyncio.Semaphore(limit)
        self._lifecycle = Lifecycle("ToolActors")
        self._spawner: pykka.ActorRef[_Spawner] | None = None
        #: The spawner's own thread, once it has stopped (it is joined last).
        self._spawner_stopped: asyncio.Future[threading.Thread] | None = None
        self._running: dict[ToolChild, None] = {}

    def __repr__(self) -> str:
        state, running = self._lifecycle.state.value, len(self._running)
        return f"<ToolActors {state}, {running}/{self._limit} running>"

    @property
    def limit(self) -> int:
        """The most child actors (and threads) at once."""
        return self._limit

    @property
    def running(self) -> int:
        """Children started and not yet reported."""
        return len(self._running)

    async def __aenter__(self) -> Self:
        self._lifecycle.open()
        loop = asyncio.get_running_loop()
        self._spawner_stopped = loop.create_future()
        self._spawner = _Spawner.start(loop, self._spawner_stopped)
        # Private plumbing: only aclose() may stop it, after every child reported.
        pykka.ActorRegistry.unregister(self._spawner)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel running children, wait for their reports, stop the spawner. Idempotent.

        Returns once every thread the pool started has ended: each child's
        (joined by the spawner, which hears their ``_Ended`` before its stop)
        and the spawner's own (joined on the blocking executor).
        """
        if self._lifecycle.close() is not LifecycleState.OPEN:
            return
        children = list(self._running)
        for child in children:
            child.request_cancel()
        await wait_all([child.done for child in children])
        spawner, self._spawner = self._spawner, None
        if spawner is not None:
            _ = spawner.stop(block=False)  # never .get() on the loop
        stopped = self._spawner_stopped
        if stopped is not None:
            await wait_all([stopped])
            await self._blocking.run(stopped.result().join)

    async def run(
        self,
        work: Work,
        *,
        call_id: str,
        cancel: CancelEvent,
        owner: ToolOwner | None = None,
    ) -> ToolOutcome:
        """Run ``work`` in a new child actor adopted by ``owner``; return its outcome.

        If the awaiting task is cancelled, the child is cancelled and ``run``
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
            spawner = self._check_open()
            loop = asyncio.get_running_loop()
            child = ToolChild(call_id, cancel, loop.create_future())
            try:
                spawner.tell(_Spawn(child=child, work=work, loop=loop))
            except pykka.ActorDeadError:
                raise ActorDeadError("ToolActors' spawner is stopped") from None
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

    def _check_open(self) -> pykka.ActorRef[_Spawner]:
        if self._lifecycle.state is LifecycleState.UNOPENED:
            raise RuntimeError("ToolActors is not open; use 'async with ToolActors()'")
        if self._spawner is None or self._lifecycle.state is LifecycleState.CLOSED:
            raise ActorDeadError("ToolActors is closed")
        return self._spawner
