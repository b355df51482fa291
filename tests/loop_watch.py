"""A slow-callback detector: a test fails when one callback holds its event loop too long.

``tests/conftest.py``'s ``slow_callbacks`` fixture uses :class:`SlowCallbacks`
around a test: every callback the test's loop runs (``asyncio.Handle._run``,
wrapped for the test's duration, on the loop's thread only) is timed, and the
test fails if one used more than :data:`THRESHOLD_S` of the loop thread's
**CPU time**, not counting the cyclic garbage collector's passes.

How the threshold was chosen (issue #42 section 1):

* CPU time, not wall time: on CI's 2 cores shared by two xdist workers (and here
  by other processes, load 15-25), a callback's wall time is mostly time spent
  waiting for a core, up to seconds (``scripts/bench_runtime.py --stalls`` saw a
  5 s wall maximum for callbacks of under 10 ms CPU). CPU time is what the code
  costs, whatever the machine's weather; a shared core slows it by a small
  factor at most (caches, clock), never by the run queue.
* The collector's passes are left out: when one runs depends on what every
  earlier test left on the heap, not on the code under test, and
  ``bench_runtime``'s lag figures report them (``--stalls`` prints them apart).
* 100 ms of CPU: the runtime's slowest callback at 100 busy sessions is under
  5 ms of CPU outside the collector (``bench_runtime --stalls 5``); 100 ms is
  20 times that, so a shared machine does not fail a good run, and still well
  under what a real stall costs (a whole-table SQLite scan, a synchronous parse
  of a large body, a file walk on the loop). ``SESSIONRT_SLOW_CALLBACK_MS`` sets
  another threshold for a local run (``=5`` shows everything above the target).

Only the runtime's callbacks count: a task or callback whose code is in tests/
(the test itself, its fixtures and helpers) is left out, unless
``include_tests``. A test's own synchronous work (validating a large document,
say) is not the runtime stalling its loop; the cost is that runtime code a test
calls directly runs in the test's task and is not seen either, only what the
runtime runs in its own tasks (actors, the server's handlers, the store's
callbacks).

A blocked call (a lock, a ``sleep``, a disk read) uses no CPU and is not seen
here; the wall time of the slowest callback is in the failure message to help
tell the two apart.

Known cases go in :data:`ALLOWED` with the reason they may run long.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Final

#: CPU seconds one callback may use on the loop (see the module docstring).
THRESHOLD_S: Final = float(os.environ.get("SESSIONRT_SLOW_CALLBACK_MS", "100")) / 1000

#: Callbacks allowed to run long, by :func:`describe`'s name, with the reason.
ALLOWED: Final[dict[str, str]] = {
    # Runtime start-up and shutdown open and close SQLite connections and
    # files on the loop once per runtime, not per request or step.
    "task Runtime.__aenter__": "start-up, once per runtime",
    "task Runtime.__aexit__": "shutdown, once per runtime",
}


_TESTS: Final = str(Path(__file__).resolve().parent) + os.sep
#: pytest-asyncio runs an async fixture's set-up and teardown in a task of its own
#: wrapper, whose code is not in tests/: the fixture's work all the same.
_FIXTURE_WRAPPERS: Final = f"{os.sep}pytest_asyncio{os.sep}"


def describe(handle: asyncio.Handle) -> tuple[str, bool]:
    """A callback's name (``task <coroutine qualname>`` for a task's step, else the
    callback's qualified name), and whether its code is the tests' own."""
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        code = getattr(coro, "cr_code", None)
        name = f"task {getattr(coro, '__qualname__', type(coro).__name__)}"
    else:
        code = getattr(getattr(callback, "__func__", callback), "__code__", None)
        name = str(getattr(callback, "__qualname__", repr(callback)))
    ours = code is not None and (
        code.co_filename.startswith(_TESTS) or _FIXTURE_WRAPPERS in code.co_filename
    )
    return name, ours


class SlowCallbacks:
    """Records every callback of the loop thread over ``threshold_s`` of CPU (collector
    passes excluded) while entered; :meth:`offenders` names those not allowed."""

    def __init__(
        self,
        threshold_s: float = THRESHOLD_S,
        allowed: dict[str, str] | None = None,
        *,
        include_tests: bool = False,
    ) -> None:
        self.threshold_s = threshold_s
        self.include_tests = include_tests
        self.allowed = ALLOWED if allowed is None else allowed
        #: (name, CPU seconds, wall seconds) of each callback over the threshold.
        self.slow: list[tuple[str, float, float]] = []
        self._thread = threading.get_ident()
        self._gc_cpu = 0.0
        self._gc_start = 0.0
        self._original: Any = None

    def _on_gc(self, stage: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread:
            return
        if stage == "start":
            self._gc_start = time.thread_time()
        else:
            self._gc_cpu += time.thread_time() - self._gc_start

    def __enter__(self) -> SlowCallbacks:
        original = asyncio.events.Handle._run
        watch = self
        cpu, wall = time.thread_time, time.perf_counter

        def timed(handle: asyncio.Handle) -> None:
            if threading.get_ident() != watch._thread:
                original(handle)
                return
            gc_before, cpu_before, wall_before = watch._gc_cpu, cpu(), wall()
            try:
                original(handle)
            finally:
                used = cpu() - cpu_before - (watch._gc_cpu - gc_before)
                if used > watch.threshold_s:
                    name, tests = describe(handle)
                    if watch.include_tests or not tests:
                        watch.slow.append((name, used, wall() - wall_before))

        self._thread = threading.get_ident()
        self._original = original
        gc.callbacks.append(self._on_gc)
        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]
        gc.callbacks.remove(self._on_gc)

    def offenders(self) -> list[str]:
        return [
            f"{name}: {used * 1000:.1f} ms CPU ({took * 1000:.1f} ms wall)"
            for name, used, took in self.slow
            if name not in self.allowed
        ]
