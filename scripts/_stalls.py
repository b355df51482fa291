"""Which callbacks hold the event loop, and where: a watchdog for the benchmarks.

    with StallWatch(threshold_s=0.005) as watch:
        ...  # run the loop
    print("\\n".join(watch.report()))

Times every callback the loop runs (``asyncio.Handle._run``, by wrapping it for
the duration), in wall time and in the loop thread's CPU time, and, from a
watchdog thread, samples the loop thread's Python stack (``sys._current_frames``)
while a callback has used more than half of ``threshold_s`` of CPU. A callback is
"slow" by its CPU time: on a shared machine its wall time is mostly the time the
thread waited for a core, which no change to the code removes (the wall-time
maximum is printed beside it). A
slow callback is then reported with the stacks it spent its time in, counted by
their innermost frames in this project's code: "which code stalled the loop", not
only "which task". The watchdog looks every ``poll_s`` (1 ms), so a sample costs
the loop thread one GIL hand-off per look at most, only while a callback is slow.

Used by ``scripts/bench_runtime.py --stalls`` (issue #42 section 1); benchmark-only.
"""

from __future__ import annotations

import array
import asyncio
import collections
import gc
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

#: Path fragments that mark this project's code in a stack.
_OURS = ("/actors/", "/storage/", "/server/", "/protocol/")


def _where(frame: FrameType | None, depth: int) -> str:
    """The innermost ``depth`` frames of the project's code under ``frame``, plus the leaf."""
    stack = traceback.extract_stack(frame)
    if not stack:
        return "?"
    leaf = stack[-1]
    ours = [f for f in stack if any(part in f.filename for part in _OURS)][-depth:]
    parts = [f"{_short(f.filename)}:{f.lineno} {f.name}" for f in ours]
    if not ours or ours[-1] is not leaf:
        parts.append(f"[leaf {_short(leaf.filename)}:{leaf.lineno} {leaf.name}]")
    return " <- ".join(reversed(parts))


def _short(filename: str) -> str:
    for part in _OURS:
        if part in filename:
            return part.strip("/") + "/" + filename.split(part, 1)[1]
    return filename.rsplit("/", 2)[-1] if "/" in filename else filename


class StallWatch:
    def __init__(self, threshold_s: float = 0.005, poll_s: float = 0.001, depth: int = 4) -> None:
        self.threshold_s = threshold_s
        self.poll_s = poll_s
        self.depth = depth
        # Arrays of doubles, not lists of floats: the collector does not walk them. A
        # list of 200,000 floats is visited float by float on every full pass, and
        # made the passes this watch measures longer than the runtime's own.
        self.durations = array.array("d")  # CPU seconds per callback
        self.outside_gc = array.array("d")  # the same, less the collector's passes within it
        self.max_wall = 0.0
        self.slow: collections.Counter[str] = collections.Counter()  # callback repr -> count
        self.slow_ms: dict[str, float] = collections.defaultdict(float)
        #: Callbacks slow even without the collector's passes in them.
        self.slow_outside_gc: collections.Counter[str] = collections.Counter()
        self.samples: collections.Counter[str] = collections.Counter()  # stack -> samples
        self._current: tuple[int, float] | None = None  # (callback number, CPU at start)
        self._seq = 0
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._original: Any = None
        self.gc_cpu: list[tuple[int, float]] = []  # (generation, CPU s) on the loop's thread
        self._gc_start = 0.0
        self._gc_total = 0.0  # collector CPU on the loop's thread so far

    def _on_gc(self, stage: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        if stage == "start":
            self._gc_start = time.thread_time()
        else:
            took = time.thread_time() - self._gc_start
            self.gc_cpu.append((int(info["generation"]), took))
            self._gc_total += took

    def __enter__(self) -> StallWatch:
        original = asyncio.events.Handle._run
        watch = self

        cpu = time.thread_time

        def timed(handle: asyncio.Handle) -> None:
            watch._seq += 1
            wall = time.perf_counter()
            start = cpu()
            gc_before = watch._gc_total
            watch._current = (watch._seq, start)
            try:
                original(handle)
            finally:
                watch._current = None
                took = cpu() - start
                watch.max_wall = max(watch.max_wall, time.perf_counter() - wall)
                watch.durations.append(took)
                outside = took - (watch._gc_total - gc_before)
                watch.outside_gc.append(outside)
                if outside >= watch.threshold_s:
                    watch.slow_outside_gc[_describe(handle)] += 1
                if took >= watch.threshold_s:
                    name = _describe(handle)
                    watch.slow[name] += 1
                    watch.slow_ms[name] += took * 1000

        self._original = original
        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        self._loop_thread = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]
        gc.callbacks.remove(self._on_gc)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        clock = time.pthread_getcpuclockid(self._loop_thread)
        while not self._stop.wait(self.poll_s):
            current = self._current
            if current is None:
                continue
            seq, start = current
            if time.clock_gettime(clock) - start < self.threshold_s * 0.5:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None or self._current is None or self._current[0] != seq:
                continue
            self.samples[_where(frame, self.depth)] += 1

    def report(self, top: int = 15) -> list[str]:
        n = len(self.durations)
        ordered = sorted(self.durations)
        over = sum(1 for d in ordered if d >= self.threshold_s)
        lines = [
            f"callbacks: {n:,}; CPU >= {self.threshold_s * 1000:g} ms: {over:,};"
            f" CPU max {ordered[-1] * 1000 if ordered else 0:.1f} ms,"
            f" p99.9 {ordered[int(0.999 * (n - 1))] * 1000 if ordered else 0:.2f} ms;"
            f" wall max {self.max_wall * 1000:.1f} ms",
        ]
        outside = sorted(self.outside_gc)
        lines.append(
            f"the same less the collector's passes: CPU >= {self.threshold_s * 1000:g} ms:"
            f" {sum(1 for d in outside if d >= self.threshold_s):,};"
            f" CPU max {outside[-1] * 1000 if outside else 0:.1f} ms"
        )
        for gen in (0, 1, 2):
            pauses = [p * 1000 for g, p in self.gc_cpu if g == gen]
            lines.append(
                f"cyclic GC generation {gen} on the loop: {len(pauses):,} passes,"
                f" CPU total {sum(pauses):.1f} ms, max {max(pauses, default=0):.2f} ms"
            )
        lines += [
            "slow callbacks (count, total CPU ms):",
        ]
        for name, count in self.slow.most_common(top):
            lines.append(f"  {count:5d} {self.slow_ms[name]:9.1f} ms  {name}")
        lines.append("slow callbacks less the collector's passes (count):")
        for name, count in self.slow_outside_gc.most_common(top):
            lines.append(f"  {count:5d}  {name}")
        lines.append("where the loop was while a callback used CPU long (samples, ~1 ms apart):")
        for where, count in self.samples.most_common(top):
            lines.append(f"  {count:5d}  {where}")
        return lines


def _describe(handle: asyncio.Handle) -> str:
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        # The task's name too, less its ids ("drain SessionActor (...)"): which
        # actor's mailbox, not only that one was drained.
        name = task.get_name().split(" (", 1)[0]
        where = "" if name.startswith("Task-") else f" [{name}]"
        return f"task {getattr(coro, '__qualname__', coro)!s}{where}"
    return repr(getattr(callback, "__qualname__", callback))
