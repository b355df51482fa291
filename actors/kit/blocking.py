"""BlockingExecutor: short blocking helpers on a bounded pool, awaited without blocking the loop.

Catalogue reads, attachment reads, ``makedirs``, the tool-output sweep and the
reaper's kills are not tool calls: they have no call to settle, no owner to
report to, no progress. They go to a plain :class:`~concurrent.futures.ThreadPoolExecutor`
of ``limit`` threads (``[runtime] max_blocking_threads``), never the loop's
default pool, whose size is not ours::

    async with BlockingExecutor(limit=4) as blocking:
        text = await blocking.run(read_text, path)

Tool calls are different: each runs in its own pykka actor owned by the
step (:mod:`actors.tools._actors`).

Cancellation is cooperative, as for any thread: if the awaiting task is
cancelled, the ``cancel`` event given to ``run`` is set and ``run`` keeps
waiting until the job has returned, then re-raises ``CancelledError``.
Nothing outlives the ``await``. ``run`` on a closed executor raises
:class:`~actors.ActorDeadError` (so callers written for the old thread bridge
keep their meaning); a ``BaseException`` from a job is wrapped in
:class:`~actors.ActorError`. Jobs waiting for a thread queue inside the pool,
bounded by whoever awaits them (every caller awaits its own job).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TypeVar, TypeVarTuple

from actors.kit.exceptions import ActorDeadError, ActorError
from protocol.lifecycle import Lifecycle, LifecycleState

__all__ = ["BlockingExecutor", "wait_all", "wait_out"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


async def wait_out(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, even through further cancellations.

    Used once the caller has already been cancelled and will re-raise that
    ``CancelledError`` itself; a second cancel must not abandon a running thread.
    """
    while not future.done():
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError:
            continue


async def wait_all(futures: list[asyncio.Future[Any]]) -> None:
    """Wait until every one of ``futures`` is done, then re-raise a cancellation that came.

    For owners that must not leave a child behind: a cancel of the caller
    neither abandons a child nor is lost (like :func:`actors.kit.shield.finish`).
    """
    cancelled = False
    for future in futures:
        while not future.done():
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError


class BlockingExecutor:
    """A bounded pool of ``limit`` threads for blocking helpers that are not tool calls."""

    def __init__(self, *, limit: int = 4, name: str = "sessionrt-blocking") -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._limit = limit
        self._name = name
        self._lifecycle = Lifecycle("BlockingExecutor")
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Jobs between submit and outcome, with their cancel events (for aclose).
        self._running: dict[asyncio.Future[Any], threading.Event | None] = {}

    def __repr__(self) -> str:
        state, jobs = self._lifecycle.state.value, len(self._running)
        return f"<BlockingExecutor {state}, {jobs} jobs, {self._limit} threads>"

    @property
    def limit(self) -> int:
        """The most threads (and so jobs running at once)."""
        return self._limit

    async def __aenter__(self) -> Self:
        self._lifecycle.open()
        # Threads start lazily, one per submit while fewer than limit exist: the
        # start of one thread is the most a submit costs the loop.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._limit, thread_name_prefix=self._name
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Ask running jobs to stop, wait for them, and end the pool's threads. Idempotent."""
        if self._lifecycle.close() is not LifecycleState.OPEN:
            return
        for cancel in self._running.values():
            if cancel is not None:
                cancel.set()
        if self._running:
            await asyncio.wait(set(self._running))
        pool, self._pool = self._pool, None
        if pool is not None:
            # Every job has returned: the idle threads exit at once; wait for them
            # on a thread of their own so the loop never joins one.
            joined = asyncio.get_running_loop().create_future()
            loop = asyncio.get_running_loop()

            def join() -> None:
                pool.shutdown(wait=True)
                loop.call_soon_threadsafe(_resolve, joined)

            joiner = threading.Thread(target=join, name=f"{self._name}-shutdown", daemon=True)
            joiner.start()
            await wait_out(joined)
            # It posted from its last line; it is gone a moment later.
            for _ in range(5000):
                if not joiner.is_alive():
                    break
                await asyncio.sleep(0.001)

    async def run(
        self,
        fn: Callable[[*Ts], T],
        *args: *Ts,
        cancel: threading.Event | None = None,
    ) -> T:
        """Run ``fn(*args)`` on a pool thread and return its result.

        Raises:
            Exception: whatever ``fn`` raised.
            ActorDeadError: the executor is closed.
            RuntimeError: the executor was never opened.
        """
        if self._lifecycle.state is LifecycleState.UNOPENED:
            raise RuntimeError("BlockingExecutor is not open; use 'async with BlockingExecutor()'")
        if self._pool is None or self._lifecycle.state is LifecycleState.CLOSED:
            raise ActorDeadError("BlockingExecutor is closed")

        def call() -> T:
            try:
                return fn(*args)
            except Exception:
                raise
            except BaseException as exc:
                error = ActorError(f"blocking job raised {type(exc).__name__}")
                raise error from exc

        try:
            done = asyncio.wrap_future(self._pool.submit(call))
        except RuntimeError:  # shut down under us
            raise ActorDeadError("BlockingExecutor is closed") from None
        self._running[done] = cancel
        try:
            try:
                await asyncio.wait({done})
            except asyncio.CancelledError:
                if cancel is not None:
                    cancel.set()
                await wait_out(done)
                if not done.cancelled():
                    done.exception()  # mark it read: we are cancelled, not its owner
                raise
            return done.result()
        finally:
            del self._running[done]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
