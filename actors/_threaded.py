"""BlockingRunner: blocking work on pykka threads, awaited without blocking the loop.

Some work can only block: file I/O, subprocess pipes, a sqlite call. It runs
in a pykka ``ThreadingActor`` child, one per job, and the event loop awaits an
ordinary asyncio future for the outcome::

    async with BlockingRunner(limit=16) as runner:
        text = await runner.run(read_text, path)

        stop = threading.Event()   # the job polls it to give up early
        await runner.run(copy_tree, src, dst, stop, cancel=stop)

The rules at this edge, and why
-------------------------------
- **Results come back with ``loop.call_soon_threadsafe``.** Asyncio futures
  are not thread-safe; the worker thread never touches one, it schedules the
  ``set_result``/``set_exception`` onto the loop, which also wakes the loop.
- **The loop never waits on pykka.** Awaiting (or ``.get()``-ing) a pykka
  future on the loop thread blocks every actor on it, so the loop side only
  ever calls non-blocking pykka methods: ``tell`` and ``stop(block=False)``.
- **The loop never starts the worker threads.** ``Thread.start()`` waits for
  the new thread to come up; fifty of those in one loop iteration is a visible
  stall. One long-lived pykka *spawner* actor per runner takes the jobs and
  starts a worker child for each, so the loop pays one ``queue.put`` per job.
  Only the spawner's own thread is started on the loop, once, by ``__aenter__``.
- **Never the default thread pool.** Its threads are shared with whatever
  else uses it and its size is not ours; here every blocking job is a visible
  actor with its own, bounded, thread.
- **A semaphore on the loop side bounds the running threads** (``limit``,
  default 16). A job holds its slot until its worker has *stopped*: the worker
  reports from ``on_stop``, after pykka has unregistered it, just before its
  thread exits, so the bound counts threads, not just calls in progress.

Cancellation
------------
Python threads cannot be interrupted, so cancellation is cooperative: if the
awaiting task is cancelled, the ``cancel`` event given to ``run`` is set (the
job is expected to poll it) and the awaiting side keeps waiting until the job
has returned and its worker has stopped, then re-raises ``CancelledError``.
Nothing outlives the ``await``: no worker actor, no thread holding a slot, no
outcome nobody will read. A job that ignores its event delays its canceller by
exactly as long as it keeps running.

Errors
------
An exception raised by the job is raised by ``run`` unchanged. A
``BaseException`` that is not an ``Exception`` (``SystemExit`` in a thread) is
wrapped in :class:`~actors.ActorError`, so a thread can never hand the loop an
exception that would stop it. ``run`` on a closed runner raises
:class:`~actors.ActorDeadError`.

pykka's registry is process-global, so other code may call
``pykka.ActorRegistry.stop_all()`` under us. The spawner is therefore taken
out of that registry (only ``aclose`` stops it), and a worker knows its job
from construction, so a stop that overtakes the job fails it with
``ActorDeadError`` instead of leaving its awaiter hanging forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, TypeVarTuple

import attrs
import pykka

from actors._exceptions import ActorDeadError, ActorError

__all__ = ["BlockingRunner"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def _set_result(done: asyncio.Future[T], value: T) -> None:
    if not done.done():
        done.set_result(value)


def _set_exception(done: asyncio.Future[Any], error: BaseException) -> None:
    if not done.done():
        done.set_exception(error)


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on ``loop`` (thread side)."""
    # RuntimeError: the loop is closed, and with it whoever was waiting; nothing to tell.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


@attrs.frozen(kw_only=True)
class _Job(Generic[T]):
    """One call to run on a worker thread, and where its outcome goes."""

    call: Callable[[], T]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[T]

    def succeed(self, value: T) -> None:
        _post(self.loop, lambda: _set_result(self.done, value))

    def fail(self, error: BaseException) -> None:
        _post(self.loop, lambda: _set_exception(self.done, error))


class _Worker(pykka.ThreadingActor):
    """Runs exactly one job on its own thread, then stops itself and reports.

    It is given its job at construction as well as told it, so that whatever
    stops it, even a stop that overtakes the job (``pykka.ActorRegistry.stop_all()``
    from some other code), its ``on_stop`` still settles the job.
    """

    def __init__(self, job: _Job[Any], exiting: set[threading.Thread]) -> None:
        super().__init__()
        self._job = job
        self._exiting = exiting
        self._report: Callable[[], None] = functools.partial(
            job.fail, ActorDeadError("blocking worker was stopped before running its job")
        )

    def on_receive(self, message: Any) -> None:
        if message is not self._job:
            super().on_receive(message)
            return
        job = self._job
        # partial, not a lambda: `except ... as exc` unbinds `exc` when the clause ends.
        try:
            value = job.call()
        except Exception as exc:
            self._report = functools.partial(job.fail, exc)
        except BaseException as exc:
            error = ActorError(f"blocking job raised {type(exc).__name__}")
            error.__cause__ = exc
            self._report = functools.partial(job.fail, error)
        else:
            self._report = functools.partial(job.succeed, value)
        # The report goes out from on_stop, so the loop sees the outcome only once
        # this actor is unregistered and its thread is on its way out.
        self.stop()

    def on_stop(self) -> None:
        # Registered before reporting: whoever learns the outcome can also
        # learn that this thread is ending (see BlockingRunner.aclose).
        self._exiting.add(threading.current_thread())
        self._report()


class _Spawner(pykka.ThreadingActor):
    """Starts one ``_Worker`` per job, so thread starts happen off the loop."""

    # It holds no work of its own; a runner left open must not keep the process alive.
    use_daemon_thread = True

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stopped: asyncio.Future[None],
        exiting: set[threading.Thread],
    ) -> None:
        super().__init__()
        self._loop = loop
        self._stopped = stopped
        self._exiting = exiting

    def on_receive(self, message: Any) -> None:
        if not isinstance(message, _Job):
            super().on_receive(message)
            return
        job: _Job[Any] = message
        try:
            _Worker.start(job, self._exiting).tell(job)
        except pykka.ActorDeadError:
            pass  # stopped before it got the job; its on_stop has failed the job
        except Exception as exc:  # e.g. "can't start new thread"
            job.fail(exc)

    def on_stop(self) -> None:
        self._exiting.add(threading.current_thread())
        stopped = self._stopped
        _post(self._loop, lambda: _set_result(stopped, None))


async def _wait_out(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, even through further cancellations.

    Used once the caller has already been cancelled and will re-raise that
    ``CancelledError`` itself; a second cancel must not abandon a running thread.
    """
    while not future.done():
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError:
            continue


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class BlockingRunner:
    """Runs blocking callables on pykka worker threads, at most ``limit`` at a time.

    An async context manager: ``__aenter__`` starts the spawner thread;
    ``__aexit__``/``aclose`` sets the cancel event of every running job, waits
    for them to return, and stops the spawner. Use it from one event loop.
    """

    def __init__(self, *, limit: int = 16) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._limit = limit
        self._slots = asyncio.Semaphore(limit)
        self._state = _State.UNOPENED
        self._spawner: pykka.ActorRef[_Spawner] | None = None
        self._spawner_stopped: asyncio.Future[None] | None = None
        #: Threads past their last report: aclose waits for them to be gone.
        self._exiting: set[threading.Thread] = set()
        # Every job between tell and outcome, with its cancel event, so aclose can
        # ask them to finish and wait for their threads.
        self._running: dict[asyncio.Future[Any], threading.Event | None] = {}

    def __repr__(self) -> str:
        return f"<BlockingRunner {self._state.value}, {len(self._running)}/{self._limit} running>"

    @property
    def limit(self) -> int:
        """The most jobs (and worker threads) running at once."""
        return self._limit

    async def __aenter__(self) -> Self:
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"BlockingRunner cannot be opened when {self._state.value}")
        self._spawner_stopped = asyncio.get_running_loop().create_future()
        self._spawner = _Spawner.start(
            asyncio.get_running_loop(), self._spawner_stopped, self._exiting
        )
        # The spawner is this runner's private plumbing: only aclose() may stop it, after
        # every job has returned. Out of pykka's registry, a pykka.ActorRegistry.stop_all()
        # elsewhere cannot strand jobs still queued in its inbox.
        pykka.ActorRegistry.unregister(self._spawner)
        self._state = _State.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Ask running jobs to stop, wait for them, and stop the spawner. Idempotent."""
        if self._state is _State.UNOPENED:
            self._state = _State.CLOSED
            return
        # From here run() refuses, including callers still queued for a slot.
        self._state = _State.CLOSED
        for cancel in self._running.values():
            if cancel is not None:
                cancel.set()
        if self._running:
            await asyncio.wait(set(self._running))
        spawner, self._spawner = self._spawner, None
        if spawner is not None:
            # The returned pykka future is dropped on purpose: .get() would block the loop,
            # and the spawner's on_stop tells us through _spawner_stopped instead.
            _ = spawner.stop(block=False)
        if self._spawner_stopped is not None:
            await asyncio.wait({self._spawner_stopped})
        # A thread reports from its last lines; it is gone a moment later. Wait
        # for that without blocking the loop, so a closed runner owns no thread.
        for _ in range(5000):
            if not any(t.is_alive() for t in self._exiting):
                break
            await asyncio.sleep(0.001)
        self._exiting.clear()

    async def run(
        self,
        fn: Callable[[*Ts], T],
        *args: *Ts,
        cancel: threading.Event | None = None,
    ) -> T:
        """Run ``fn(*args)`` on a worker thread and return its result.

        Waits for a free slot first. If the awaiting task is cancelled while the
        job runs, ``cancel`` is set and ``run`` waits for the job to return before
        re-raising ``CancelledError``; pass the same event to ``fn`` so it can
        notice. ``aclose`` sets it too, and then ``run`` returns whatever ``fn``
        returns (or raises) after noticing.

        Raises:
            Exception: whatever ``fn`` raised.
            ActorDeadError: the runner is closed, or closed while this call
                waited for a slot.
            RuntimeError: the runner was never opened.
        """
        self._check_open()
        async with self._slots:
            spawner = self._check_open()  # it may have closed while we queued for the slot
            done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

            def call() -> T:
                return fn(*args)

            job = _Job(call=call, loop=asyncio.get_running_loop(), done=done)
            try:
                spawner.tell(job)
            except pykka.ActorDeadError:
                raise ActorDeadError("BlockingRunner's spawner is stopped") from None
            self._running[done] = cancel
            try:
                try:
                    # wait() rather than await: cancelling us must not cancel `done`, which
                    # is the only way we learn that the thread has finished.
                    await asyncio.wait({done})
                except asyncio.CancelledError:
                    if cancel is not None:
                        cancel.set()
                    await _wait_out(done)
                    if not done.cancelled():
                        done.exception()  # mark it read: we are cancelled, not its owner
                    raise
                return done.result()
            finally:
                del self._running[done]

    def _check_open(self) -> pykka.ActorRef[_Spawner]:
        if self._state is _State.UNOPENED:
            raise RuntimeError("BlockingRunner is not open; use 'async with BlockingRunner()'")
        if self._spawner is None or self._state is _State.CLOSED:
            raise ActorDeadError("BlockingRunner is closed")
        return self._spawner
