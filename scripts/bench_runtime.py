#!/usr/bin/env python3
"""Runtime overhead per step, concurrent steps/s, idle-session memory and event-loop lag.

    .venv/bin/python scripts/bench_runtime.py                  # table
    .venv/bin/python scripts/bench_runtime.py --json           # one JSON object on stdout
    .venv/bin/python scripts/bench_runtime.py --steps 100 --idle 2000 --quiet
    .venv/bin/python scripts/bench_runtime.py --no-gc-freeze  # lag including full-GC pauses

Everything runs in one process and one event loop, on fresh temp data dirs, with the
scripted model at zero delay (no ``#delay``; the default reply, one text block). Each
figure is measured next to a baseline from the same run:

1. **Overhead per step, one session.** ``--steps`` prompts, one after another, on one
   session: ``sessions.prompt(..., resume=False)`` then ``execution.resume(sid)``, so
   each prompt is one busy period with one step. After each runtime step the
   *baseline* step runs on a bare :class:`~storage.SQLiteStore` of its own (same
   ``synchronous``): it consumes the :class:`~actors.llm.ScriptedProvider` stream for
   the very request the runtime sent (recorded by a pass-through provider) and makes
   the same durable appends with the same awaits (enqueued; execution.started;
   delivered; step.started + text.started + text.ended + step.ended submitted together
   and awaited; execution.succeeded: five COMMITs, eight events). Runtime and
   baseline steps alternate, so both see the same disk. "overhead" is runtime ms/step
   minus baseline ms/step: reads, actor messages, the agent catalog, history
   reads, bus publishing. It runs at ``synchronous=FULL`` (the default, the one
   the target is judged on) and again at ``NORMAL`` to show how much of a step is
   fsync. COMMITs per step are counted for both by wrapping the store writer's
   private ``submit`` in this script (library code is not modified).
2. **Steps/s with ``--sessions`` concurrent sessions.** Each session gets ``--rounds``
   prompts one after another, all sessions at once (FULL). The baseline replays the
   recorded requests as baseline steps, the same sessions and rounds concurrently,
   on a bare store. The two take turns, ``--chunk-rounds`` rounds at a time (the
   runtime's rounds, then the baseline's replay of those very requests), and each
   side's figures are summed over its turns: a machine whose speed drifts over the
   run (a shared host) slows both alike, where one whole phase after the other
   moved the ratio by a fifth between identical runs. Target: the runtime at
   least half the bare store's steps/s (issue #15). Both also show the process's
   CPU per step and its threads'
   context switches per step (Linux ``/proc``): a thread that runs sqlite3
   statements (the writer; a reader, for a read past the inline budget of
   ``storage._inline_reads``) hands the GIL off and back at every statement
   step, and each hand-off while the loop is busy is a switch or two.
3. **Memory per idle session.** On a fresh runtime (warmed up by one prompt),
   ``tracemalloc`` starts, then ``--idle`` sessions are created through the runtime
   (100 concurrent creators) and 100 of them get one prompt each (their actors
   start and retire). After ``gc.collect()``: traced Python memory delta (excluding
   tracemalloc's own snapshot objects and this script's allocations) per session,
   and the VmRSS delta per session, raw and minus the growth of SQLite's own heap
   (``sqlite3_memory_used``: page caches, outside Python) and tracemalloc's
   bookkeeping. Live ``SessionActor`` objects are counted in the supervisor's directory and
   by a ``gc`` scan; the biggest allocation sites are listed.
4. **Event-loop lag.** A ticker task sleeps 1 ms in a loop throughout; each tick's
   lateness (gap minus 1 ms) is attributed to the phase it started in (phase 1's
   rows include its interleaved baseline steps). Ticks that span this script's own
   synchronous measurement work between phases are dropped. The cyclic GC's pauses
   are timed per phase too (``gc.callbacks``: wall time, and for full passes the CPU
   time of the thread that ran them, which a shared machine does not inflate), with
   the most objects the collector tracked at the end of each stretch of the phase
   (``len(gc.get_objects())``: what a full pass walks); ``gc.freeze()`` (default)
   moves everything imported before the phases out of the collector's reach, to show
   how much of the lag is full collections. Phase 3 runs with tracemalloc on, which slows
   allocation-heavy code: its lag is an upper bound.

Targets (informational; 2 cores): overhead <= 2 ms per step (FULL), concurrent steps/s
>= 0.5x the bare store's, <= 2 KiB per idle session (tracemalloc), loop lag <= 10 ms (max
over the runtime phases, those not instrumented by tracemalloc; start-up objects frozen
out of the collector as ``sessionrt serve`` does, unless ``--no-gc-freeze``). The exit
status is 0 unless the benchmark itself fails.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
from _benchlib import report_main, target_lines

from actors.llm import (
    SCRIPTED_PROVIDER_ID,
    Finish,
    ModelRequest,
    ScriptedProvider,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
)
from actors.runtime import Runtime, RuntimeConfig
from actors.session import SessionActor
from protocol import events as ev
from protocol import ids
from protocol.requests import PromptInput
from protocol.shapes import Location
from storage import Command, SQLiteStore, Synchronous, now_ms

TARGET_OVERHEAD_MS: Final = 2.0
#: Concurrent steps/s as a share of the bare store's (issue #15 section 5).
TARGET_CONCURRENT_SHARE: Final = 0.5
TARGET_IDLE_BYTES: Final = 2048
TARGET_LAG_MS: Final = 10.0
TICK_S: Final = 0.001
WARMUP_STEPS: Final = 5
IDLE_PROMPTED: Final = 100
IDLE_CREATORS: Final = 100
PROMPT: Final = "Summarise the state of the build and list what is left to do, step {i}."


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench_runtime] {message}", file=sys.stderr, flush=True)


# -- measuring helpers ----------------------------------------------------------------------------


class LagMonitor:
    """A 1 ms ticker recording each tick's lateness under the phase it started in.

    It also times the cyclic garbage collector's pauses (``gc.callbacks``), a
    common source of lag that is nobody's ``await``.
    """

    def __init__(self) -> None:
        self._phase: str | None = None
        self._epoch = 0
        #: Lateness per tick (an array: the collector does not walk it, as it would a list)
        self.samples: dict[str, array.array[float]] = {}
        #: (generation, wall seconds, CPU seconds of the thread that ran it) per pass
        self.gc_pauses: dict[str, list[tuple[int, float, float]]] = {}
        #: The most objects the collector tracked (``gc.get_objects()``, frozen ones
        #: aside) at the end of each stretch of the phase: what a full pass walks.
        self.tracked: dict[str, int] = {}
        self._gc_start = 0.0
        self._gc_cpu_start = 0.0
        self._task: asyncio.Task[None] | None = None

    def _on_gc(self, stage: str, info: dict[str, Any]) -> None:
        if stage == "start":
            self._gc_start = time.perf_counter()
            self._gc_cpu_start = time.thread_time()
        elif self._phase is not None:
            pause = time.perf_counter() - self._gc_start
            cpu = time.thread_time() - self._gc_cpu_start
            self.gc_pauses[self._phase].append((int(info["generation"]), pause, cpu))

    def phase(self, name: str | None) -> None:
        """Switch phase; ``None`` pauses recording (synchronous measurement work follows)."""
        if self._phase is not None and name != self._phase:
            tracked = len(gc.get_objects())
            self.tracked[self._phase] = max(self.tracked.get(self._phase, 0), tracked)
            self._epoch += 1  # the tick spanning the count is dropped
        if name is None or self._phase is None:
            self._epoch += 1  # a tick spanning a pause is dropped
        self._phase = name
        if name is not None:
            self.samples.setdefault(name, array.array("d"))
            self.gc_pauses.setdefault(name, [])

    async def _run(self) -> None:
        while True:
            epoch, phase = self._epoch, self._phase
            start = time.perf_counter()
            await asyncio.sleep(TICK_S)
            late = time.perf_counter() - start - TICK_S
            if phase is not None and epoch == self._epoch:
                self.samples[phase].append(max(late, 0.0))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lag-monitor")
        gc.callbacks.append(self._on_gc)

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def stats(self, name: str) -> dict[str, Any]:
        values = self.samples.get(name, [])
        pauses = self.gc_pauses.get(name, [])
        full_cpu = [cpu for gen, _, cpu in pauses if gen == 2]
        return {
            "phase": name,
            "ticks": len(values),
            "p99_ms": round(_quantile(values, 0.99) * 1000, 3),
            "max_ms": round(max(values, default=0.0) * 1000, 3),
            "gc_collections": len(pauses),
            "gc_full_collections": len(full_cpu),
            "gc_total_ms": round(sum(p for _, p, _ in pauses) * 1000, 3),
            "gc_max_ms": round(max((p for _, p, _ in pauses), default=0.0) * 1000, 3),
            "gc_full_cpu_total_ms": round(sum(full_cpu) * 1000, 3),
            "gc_full_cpu_max_ms": round(max(full_cpu, default=0.0) * 1000, 3),
            "tracked_objects": self.tracked.get(name),
        }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def context_switches() -> int | None:
    """Context switches so far of this process's live threads (Linux); None elsewhere.

    Each is a thread giving the CPU up (waiting for the GIL, a lock, I/O) or
    having it taken: under load they are where a threaded SQLite store's time
    goes, since every statement hands the GIL off and back.
    """
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            continue  # the thread ended meanwhile
    return total


def _switches_since(before: int | None) -> int | None:
    after = context_switches()
    return None if before is None or after is None else after - before


def _sqlite_memory_used() -> Callable[[], int] | None:
    """``sqlite3_memory_used`` of the libsqlite3 the ``sqlite3`` module is linked to."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        fn = lib.sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = []
    return lambda: int(fn())


class CommitCounter:
    """Counts COMMITs (batches handed to the store's writer) and the commands in them."""

    def __init__(self, store: SQLiteStore) -> None:
        writer = store._writer
        assert writer is not None
        self.batches = 0
        self.commands = 0
        submit = writer.submit

        def counting(batch: list[Any]) -> None:
            self.batches += 1
            self.commands += len(batch)
            submit(batch)

        writer.submit = counting  # type: ignore[method-assign]

    def per_batch(self) -> float:
        return round(self.commands / self.batches, 2) if self.batches else 0.0


class RecordingProvider:
    """The scripted model, keeping the latest request per session and a count.

    Only the latest: holding every request (each a fresh copy of a growing history)
    would put enough objects on the heap to lengthen the collector's pauses, which
    the lag monitor would then blame on the runtime.
    """

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.last: dict[str, ModelRequest] = {}
        self.count: dict[str, int] = {}

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        self.last[request.session_id] = request
        self.count[request.session_id] = self.count.get(request.session_id, 0) + 1
        return self.inner.stream(request)


@contextlib.asynccontextmanager
async def open_runtime(
    root: Path, name: str, synchronous: Synchronous, provider: RecordingProvider | None = None
) -> AsyncIterator[Runtime]:
    base = root / name
    (base / "project").mkdir(parents=True)
    config = RuntimeConfig(
        data_dir=base / "data",
        synchronous=synchronous,
        default_directory=str(base / "project"),
        providers={} if provider is None else {SCRIPTED_PROVIDER_ID: provider},
    )
    async with Runtime(config) as rt:
        yield rt


async def runtime_step(rt: Runtime, session_id: str, text: str) -> float:
    start = time.perf_counter()
    await rt.sessions.prompt(session_id, PromptInput(text=text, resume=False))
    terminal = await rt.execution.resume(session_id)
    elapsed = time.perf_counter() - start
    if terminal.kind != "succeeded":
        raise RuntimeError(f"runtime step ended {terminal}")
    return elapsed


class BaselineSession:
    """One session's steps without the runtime: the model stream plus the same appends."""

    def __init__(self, store: SQLiteStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.provider = ScriptedProvider()

    @classmethod
    async def create(cls, store: SQLiteStore, directory: str) -> BaselineSession:
        sid = ids.session_id()
        await store.append(
            Command.of(
                ev.SessionCreated(
                    session_id=sid, title="bench", location=Location(directory=directory)
                )
            )
        )
        return cls(store, sid)

    async def step(self, text: str, request: ModelRequest) -> tuple[float, float]:
        """One baseline step; returns (total seconds, seconds consuming the model stream)."""
        sid, store = self.session_id, self.store
        start = time.perf_counter()
        inbox_id = ids.message_id()
        item = ev.EnqueuedItem(type="user", payload={"text": text}, delivery="steer")
        await store.append(
            Command.of(ev.InboxEnqueued(session_id=sid, inbox_id=inbox_id, item=item))
        )
        await store.append(Command.of(ev.ExecutionStarted(session_id=sid)))
        await store.append(Command.of(ev.InboxDelivered(session_id=sid, inbox_id=inbox_id)))
        aid = ids.message_id()
        on = {"session_id": sid, "assistant_message_id": aid}
        submitted = [
            store.submit(
                Command.of(
                    ev.StepStarted(**on, agent="build", model=request.model, started=now_ms())
                )
            )
        ]
        model_start = time.perf_counter()
        async with contextlib.aclosing(self.provider.stream(request)) as stream:
            parts = [part async for part in stream]
        model = time.perf_counter() - model_start
        texts: dict[int, list[str]] = {}
        finished: Finish | None = None
        for part in parts:
            match part:
                case TextStart(ordinal=n):
                    texts[n] = []
                    submitted.append(store.submit(Command.of(ev.TextStarted(**on, ordinal=n))))
                case TextChunk(ordinal=n, delta=d):
                    texts[n].append(d)
                case TextEnd(ordinal=n):
                    text_ = "".join(texts.pop(n))
                    submitted.append(
                        store.submit(Command.of(ev.TextEnded(**on, ordinal=n, text=text_)))
                    )
                case Finish():
                    finished = part
        if finished is None:
            raise RuntimeError("the scripted stream did not finish")
        usage = finished.usage
        tokens = ev.StepTokens(input=usage.input, output=usage.output, reasoning=usage.reasoning)
        submitted.append(
            store.submit(
                Command.of(
                    ev.StepEnded(**on, finish=finished.reason, cost=usage.cost, tokens=tokens)
                )
            )
        )
        for future in submitted:
            await future
        await store.append(Command.of(ev.ExecutionSucceeded(session_id=sid)))
        return time.perf_counter() - start, model


async def wait_retired(rt: Runtime, deadline_s: float = 10.0) -> int:
    """Wait (bounded) until no SessionActor is live; returns how many still are."""
    poll = 0.005
    for _ in range(int(deadline_s / poll)):
        if not rt.execution.session_actors():
            break
        await asyncio.sleep(poll)
    return len(rt.execution.session_actors())


# -- phase 1 ------------------------------------------------------------------------------------


async def phase_steps(
    args: argparse.Namespace, root: Path, lag: LagMonitor, synchronous: Synchronous
) -> dict[str, Any]:
    label = f"1. one session, {synchronous}"
    provider = RecordingProvider()
    async with (
        open_runtime(root, f"steps-{synchronous}", synchronous, provider) as rt,
        SQLiteStore(root / f"baseline-{synchronous}.db", synchronous=synchronous) as store,
    ):
        session = await rt.sessions.create()
        base = await BaselineSession.create(store, str(root))
        rt_commits, base_commits = CommitCounter(rt.store), CommitCounter(store)
        runtime_s: list[float] = []
        baseline_s: list[float] = []
        model_s: list[float] = []
        rt_batches = base_batches = 0
        budget_hit = False
        deadline = time.perf_counter() + args.budget
        lag.phase(label)
        for i in range(WARMUP_STEPS + args.steps):
            if i == WARMUP_STEPS:
                rt_batches, base_batches = rt_commits.batches, base_commits.batches
            text = PROMPT.format(i=i)
            elapsed = await runtime_step(rt, session.id, text)
            request = provider.last[session.id]
            total, model = await base.step(text, request)
            if i >= WARMUP_STEPS:
                runtime_s.append(elapsed)
                baseline_s.append(total)
                model_s.append(model)
            if time.perf_counter() >= deadline and i >= WARMUP_STEPS:
                budget_hit = True
                break
        lag.phase(None)
        steps = len(runtime_s)
        recorded = provider.count[session.id]
        if recorded != steps + WARMUP_STEPS:
            raise RuntimeError(f"{recorded} model requests for {steps + WARMUP_STEPS} steps")
        history = len(provider.last[session.id].messages)
        rt_commits_per = (rt_commits.batches - rt_batches) / steps
        base_commits_per = (base_commits.batches - base_batches) / steps
    runtime_ms = statistics.fmean(runtime_s) * 1000
    baseline_ms = statistics.fmean(baseline_s) * 1000
    decile = max(1, steps // 10)
    return {
        "synchronous": synchronous,
        "steps": steps,
        "budget_hit": budget_hit,
        "runtime_ms_per_step": round(runtime_ms, 3),
        "runtime_p50_ms": round(statistics.median(runtime_s) * 1000, 3),
        "baseline_ms_per_step": round(baseline_ms, 3),
        "baseline_p50_ms": round(statistics.median(baseline_s) * 1000, 3),
        "model_ms_per_step": round(statistics.fmean(model_s) * 1000, 3),
        "overhead_ms_per_step": round(runtime_ms - baseline_ms, 3),
        "overhead_p50_ms": round(
            (statistics.median(runtime_s) - statistics.median(baseline_s)) * 1000, 3
        ),
        "overhead_first_decile_ms": round(
            (statistics.fmean(runtime_s[:decile]) - statistics.fmean(baseline_s[:decile])) * 1000,
            3,
        ),
        "overhead_last_decile_ms": round(
            (statistics.fmean(runtime_s[-decile:]) - statistics.fmean(baseline_s[-decile:])) * 1000,
            3,
        ),
        "history_messages_at_end": history,
        "runtime_first_decile_ms": round(statistics.fmean(runtime_s[:decile]) * 1000, 3),
        "runtime_last_decile_ms": round(statistics.fmean(runtime_s[-decile:]) * 1000, 3),
        "baseline_first_decile_ms": round(statistics.fmean(baseline_s[:decile]) * 1000, 3),
        "baseline_last_decile_ms": round(statistics.fmean(baseline_s[-decile:]) * 1000, 3),
        "runtime_commits_per_step": round(rt_commits_per, 2),
        "baseline_commits_per_step": round(base_commits_per, 2),
    }


# -- phase 2 ------------------------------------------------------------------------------------


async def phase_concurrent(args: argparse.Namespace, root: Path, lag: LagMonitor) -> dict[str, Any]:
    sessions, rounds, chunk = args.sessions, args.rounds, args.chunk_rounds
    provider = RecordingProvider()
    latencies = array.array("d")  # not a list: the collector would walk it (see LagMonitor)
    runtime = _Side()
    baseline = _Side()
    async with (
        open_runtime(root, "concurrent", "FULL", provider) as rt,
        SQLiteStore(root / "baseline-concurrent.db", synchronous="FULL") as store,
    ):
        sids = [(await rt.sessions.create()).id for _ in range(sessions)]
        bases = [await BaselineSession.create(store, str(root)) for _ in range(sessions)]
        for sid in sids[:WARMUP_STEPS]:  # warm-up, untimed: one step on a few sessions
            await runtime_step(rt, sid, "warm-up")
        warm = provider.last[sids[0]]
        for base in bases[:WARMUP_STEPS]:
            await base.step("warm-up", warm)
        rt_commits, base_commits = CommitCounter(rt.store), CommitCounter(store)
        done = 0
        while done < rounds:
            now = range(done, min(rounds, done + chunk))
            # Each chunk's requests, as the runtime sent them, for the baseline to replay.
            sent: dict[str, list[ModelRequest]] = {sid: [] for sid in sids}

            async def drive(sid: str, now: range = now, sent: dict[str, Any] = sent) -> None:
                for i in now:
                    latencies.append(await runtime_step(rt, sid, PROMPT.format(i=i)))
                    sent[sid].append(provider.last[sid])

            async def replay(
                base: BaselineSession, sid: str, now: range = now, sent: dict[str, Any] = sent
            ) -> None:
                for i, request in zip(now, sent[sid], strict=True):
                    await base.step(PROMPT.format(i=i), request)

            lag.phase("2. concurrent sessions")
            await runtime.measure(asyncio.gather(*(drive(sid) for sid in sids)))
            lag.phase("2. baseline (bare store)")
            await baseline.measure(
                asyncio.gather(*(replay(b, s) for b, s in zip(bases, sids, strict=True)))
            )
            lag.phase(None)
            done = now.stop
        active = await rt.execution.active()
        if active:
            raise RuntimeError(f"{len(active)} sessions still busy after phase 2")
    steps = sessions * rounds
    return {
        "sessions": sessions,
        "rounds": rounds,
        "chunk_rounds": chunk,
        "steps": steps,
        "seconds": round(runtime.seconds, 4),
        "steps_per_s": round(steps / runtime.seconds, 1),
        "step_latency_p50_ms": round(_quantile(latencies, 0.5) * 1000, 3),
        "step_latency_p99_ms": round(_quantile(latencies, 0.99) * 1000, 3),
        "commits": rt_commits.batches,
        "commands_per_commit": rt_commits.per_batch(),
        "cpu_ms_per_step": round(runtime.cpu / steps * 1000, 3),
        "context_switches_per_step": runtime.switches_per(steps),
        "baseline_seconds": round(baseline.seconds, 4),
        "baseline_cpu_ms_per_step": round(baseline.cpu / steps * 1000, 3),
        "baseline_context_switches_per_step": baseline.switches_per(steps),
        "baseline_steps_per_s": round(steps / baseline.seconds, 1),
        "baseline_commands_per_commit": base_commits.per_batch(),
    }


class _Side:
    """Wall time, CPU and context switches summed over one side's chunks of phase 2."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu = 0.0
        self.switches: int | None = 0

    async def measure(self, work: Awaitable[Any]) -> None:
        switches, cpu = context_switches(), time.process_time()
        start = time.perf_counter()
        await work
        self.seconds += time.perf_counter() - start
        self.cpu += time.process_time() - cpu
        more = _switches_since(switches)
        self.switches = None if more is None or self.switches is None else self.switches + more

    def switches_per(self, steps: int) -> float | None:
        return None if self.switches is None else round(self.switches / steps, 1)


# -- phase 3 ------------------------------------------------------------------------------------


@attrs.frozen
class MemoryPoint:
    traced: int
    rss: int
    sqlite: int | None
    tracemalloc_own: int


def _memory_point(sqlite_mem: Callable[[], int] | None) -> MemoryPoint:
    gc.collect()
    return MemoryPoint(
        traced=tracemalloc.get_traced_memory()[0],
        rss=rss_bytes(),
        sqlite=None if sqlite_mem is None else sqlite_mem(),
        tracemalloc_own=tracemalloc.get_tracemalloc_memory(),
    )


def _own_filters() -> list[tracemalloc.Filter]:
    """Leave out tracemalloc's snapshots and this script's own allocations (lag samples)."""
    return [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, os.path.abspath(__file__)),
        tracemalloc.Filter(False, "<unknown>"),
    ]


async def phase_idle(args: argparse.Namespace, root: Path, lag: LagMonitor) -> dict[str, Any]:
    count = args.idle
    sqlite_mem = _sqlite_memory_used()
    async with open_runtime(root, "idle", "FULL") as rt:
        # Warm-up: lazy imports, reader connections, codec plans, the first actor.
        warm = await rt.sessions.create()
        await runtime_step(rt, warm.id, "warm-up")
        await wait_retired(rt)

        lag.phase(None)
        tracemalloc.start()
        try:
            before = _memory_point(sqlite_mem)
            snap_before = tracemalloc.take_snapshot().filter_traces(_own_filters())
            prompted: list[str] = []
            every = max(1, count // IDLE_PROMPTED)
            per_creator = [count // IDLE_CREATORS] * IDLE_CREATORS
            for i in range(count % IDLE_CREATORS):
                per_creator[i] += 1

            async def creator(n: int, offset: int) -> None:
                for i in range(n):
                    session = await rt.sessions.create()
                    if (offset + i) % every == 0 and len(prompted) < IDLE_PROMPTED:
                        prompted.append(session.id)

            lag.phase("3. create idle sessions (tracemalloc on)")
            start = time.perf_counter()
            offsets = [sum(per_creator[:k]) for k in range(IDLE_CREATORS)]
            await asyncio.gather(
                *(creator(n, off) for n, off in zip(per_creator, offsets, strict=True) if n)
            )
            create_s = time.perf_counter() - start
            lag.phase(f"3. prompt {IDLE_PROMPTED} of them at once (tracemalloc on)")
            await asyncio.gather(
                *(runtime_step(rt, sid, "one prompt before idling") for sid in prompted)
            )
            registered = await wait_retired(rt)
            await asyncio.sleep(0.05)  # let the retired actors' stop tasks finish
            lag.phase(None)
            prompted_count = len(prompted)
            prompted.clear()
            after = _memory_point(sqlite_mem)
            snap_after = tracemalloc.take_snapshot().filter_traces(_own_filters())
            instances = sum(1 for o in gc.get_objects() if isinstance(o, SessionActor))
            diff = snap_after.compare_to(snap_before, "lineno")
            own_traced = sum(s.size_diff for s in diff)
        finally:
            tracemalloc.stop()
        rows = await rt.store.fetch("SELECT count(*) FROM session")
        sessions_in_store = int(rows[0][0])
    traced = own_traced
    rss = after.rss - before.rss
    sqlite_delta = (
        None if after.sqlite is None or before.sqlite is None else after.sqlite - before.sqlite
    )
    tm_delta = after.tracemalloc_own - before.tracemalloc_own
    rss_adjusted = rss - (sqlite_delta or 0) - tm_delta
    top = [
        {
            "site": f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}",
            "bytes": s.size_diff,
            "bytes_per_session": round(s.size_diff / count, 1),
            "blocks": s.count_diff,
        }
        for s in diff[:8]
        if s.size_diff > 0
    ]
    return {
        "sessions": count,
        "sessions_in_store": sessions_in_store,
        "prompted": prompted_count,
        "create_seconds": round(create_s, 3),
        "creates_per_s": round(count / create_s, 1),
        "traced_bytes": traced,
        "traced_bytes_per_session": round(traced / count, 1),
        "traced_total_delta_bytes": after.traced - before.traced,
        "rss_bytes": rss,
        "rss_bytes_per_session": round(rss / count, 1),
        "sqlite_heap_bytes": sqlite_delta,
        "tracemalloc_own_bytes": tm_delta,
        "rss_adjusted_bytes_per_session": round(rss_adjusted / count, 1),
        "session_actors_registered": registered,
        "session_actor_instances": instances,
        "top_sites": top,
    }


def _short(filename: str) -> str:
    here = str(Path(__file__).resolve().parent.parent) + os.sep
    if filename.startswith(here):
        return filename[len(here) :]
    marker = f"{os.sep}site-packages{os.sep}"
    if marker in filename:
        return filename.split(marker, 1)[1]
    return filename


# -- driver -------------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    if args.gc_freeze:
        gc.collect()
        gc.freeze()  # everything imported so far leaves the collector's generations
    lag = LagMonitor()
    lag.start()
    try:
        steps = []
        for synchronous in ("FULL", "NORMAL"):
            _log(args, f"phase 1: {args.steps} steps on one session, {synchronous} ...")
            result = await phase_steps(args, root, lag, synchronous)
            _log(
                args,
                f"  runtime {result['runtime_ms_per_step']:.2f} ms/step, baseline "
                f"{result['baseline_ms_per_step']:.2f}, overhead "
                f"{result['overhead_ms_per_step']:.2f}",
            )
            steps.append(result)
        _log(args, f"phase 2: {args.sessions} sessions x {args.rounds} prompts ...")
        concurrent = await phase_concurrent(args, root, lag)
        _log(
            args,
            f"  {concurrent['steps_per_s']:,.0f} steps/s "
            f"(baseline {concurrent['baseline_steps_per_s']:,.0f})",
        )
        _log(args, f"phase 3: {args.idle:,} idle sessions ...")
        idle = await phase_idle(args, root, lag)
        _log(args, f"  {idle['traced_bytes_per_session']:,.0f} B/session (tracemalloc)")
    finally:
        await lag.stop()
    lags = [lag.stats(name) for name in lag.samples]
    return {"steps": steps, "concurrent": concurrent, "idle": idle, "loop_lag": lags}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_runtime-", dir=args.dir) as directory:
        if args.stalls:
            from _stalls import StallWatch

            with StallWatch(threshold_s=args.stalls / 1000) as watch:
                results = asyncio.run(run_all(args, Path(directory)))
            print("\n".join(watch.report()), file=sys.stderr, flush=True)
        else:
            results = asyncio.run(run_all(args, Path(directory)))
    full = next(r for r in results["steps"] if r["synchronous"] == "FULL")
    # Baseline phases are not the runtime; tracemalloc phases measure memory and
    # the tracer itself stalls the loop, so neither counts toward the lag target.
    runtime_lags = [
        row
        for row in results["loop_lag"]
        if "baseline" not in row["phase"] and "tracemalloc" not in row["phase"]
    ]
    worst = max((row["max_ms"] for row in runtime_lags), default=0.0)
    idle = results["idle"]
    concurrent = results["concurrent"]
    share = concurrent["steps_per_s"] / concurrent["baseline_steps_per_s"]
    targets = [
        {
            "name": f"runtime overhead <= {TARGET_OVERHEAD_MS:g} ms per step (FULL, mean)",
            "value": full["overhead_ms_per_step"],
            "unit": "ms",
            "pass": full["overhead_ms_per_step"] <= TARGET_OVERHEAD_MS,
        },
        {
            "name": f"steps/s, {concurrent['sessions']} sessions concurrently, >="
            f" {TARGET_CONCURRENT_SHARE:g}x the bare store's",
            "value": round(share, 3),
            "unit": "x",
            "pass": share >= TARGET_CONCURRENT_SHARE,
        },
        {
            "name": f"<= {TARGET_IDLE_BYTES / 1024:g} KiB per idle session (tracemalloc)",
            "value": idle["traced_bytes_per_session"],
            "unit": "B",
            "pass": idle["traced_bytes_per_session"] <= TARGET_IDLE_BYTES,
        },
        {
            "name": f"event-loop lag <= {TARGET_LAG_MS:g} ms (max over runtime phases)",
            "value": worst,
            "unit": "ms",
            "pass": worst <= TARGET_LAG_MS,
        },
    ]
    return {
        "benchmark": "runtime",
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "warmup_steps": WARMUP_STEPS,
        "gc_freeze": args.gc_freeze,
        **results,
        "targets": targets,
    }


def _opt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _opt_int(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = [
        " | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return lines


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sessionrt runtime benchmark: scripted model, zero delay, Python {report['python']}, "
        f"SQLite {report['sqlite_version']}, {report['cpus']} CPUs"
        + (", gc.freeze() after imports" if report["gc_freeze"] else ""),
        "",
        "1. one session, one step per prompt (prompt resume=False + execution.resume), "
        f"after {report['warmup_steps']} warm-up steps",
    ]
    lines += _table(
        (
            "synchronous",
            "steps",
            "runtime ms/step",
            "baseline ms/step",
            "of which model",
            "overhead ms/step",
            "overhead 1st -> last 10%",
            "COMMITs/step rt|base",
        ),
        [
            (
                r["synchronous"],
                f"{r['steps']:,}" + ("*" if r["budget_hit"] else ""),
                f"{r['runtime_ms_per_step']:.3f}",
                f"{r['baseline_ms_per_step']:.3f}",
                f"{r['model_ms_per_step']:.3f}",
                f"{r['overhead_ms_per_step']:.3f}",
                f"{r['overhead_first_decile_ms']:.2f} -> {r['overhead_last_decile_ms']:.2f}",
                f"{r['runtime_commits_per_step']:g} | {r['baseline_commits_per_step']:g}",
            )
            for r in report["steps"]
        ],
    )
    last = report["steps"][-1]
    lines.append(
        f"  the model request of the last step carried {last['history_messages_at_end']:,}"
        " messages; each step reads only the history rows changed since the last one"
    )
    if any(r["budget_hit"] for r in report["steps"]):
        lines.append("* stopped by the time budget")
    c = report["concurrent"]
    lines += [
        "",
        f"2. {c['sessions']} concurrent sessions x {c['rounds']} prompts each (FULL)",
    ]
    lines += _table(
        (
            "run",
            "steps",
            "seconds",
            "steps/s",
            "cmds/COMMIT",
            "step p50 ms",
            "step p99 ms",
            "CPU ms/step",
            "ctx switches/step",
        ),
        [
            (
                "runtime",
                f"{c['steps']:,}",
                f"{c['seconds']:.3f}",
                f"{c['steps_per_s']:,.0f}",
                f"{c['commands_per_commit']:.1f}",
                f"{c['step_latency_p50_ms']:.2f}",
                f"{c['step_latency_p99_ms']:.2f}",
                f"{c['cpu_ms_per_step']:.2f}",
                _opt(c["context_switches_per_step"]),
            ),
            (
                "baseline (bare store)",
                f"{c['steps']:,}",
                f"{c['baseline_seconds']:.3f}",
                f"{c['baseline_steps_per_s']:,.0f}",
                f"{c['baseline_commands_per_commit']:.1f}",
                "-",
                "-",
                f"{c['baseline_cpu_ms_per_step']:.2f}",
                _opt(c["baseline_context_switches_per_step"]),
            ),
        ],
    )
    i = report["idle"]
    sqlite_b = "n/a" if i["sqlite_heap_bytes"] is None else f"{i['sqlite_heap_bytes']:,}"
    lines += [
        "",
        f"3. {i['sessions']:,} idle sessions ({i['prompted']} of them prompted once; "
        f"created at {i['creates_per_s']:,.0f}/s with tracemalloc on)",
    ]
    lines += _table(
        (
            "tracemalloc B/session",
            "RSS B/session",
            "RSS - SQLite heap - tracemalloc B/session",
            "SQLite heap delta B",
            "SessionActors live | objects",
        ),
        [
            (
                f"{i['traced_bytes_per_session']:,.0f}",
                f"{i['rss_bytes_per_session']:,.0f}",
                f"{i['rss_adjusted_bytes_per_session']:,.0f}",
                sqlite_b,
                f"{i['session_actors_registered']} | {i['session_actor_instances']}",
            )
        ],
    )
    if i["top_sites"]:
        lines.append("  largest traced growth (bytes per session):")
        for site in i["top_sites"]:
            per, blocks = site["bytes_per_session"], site["blocks"]
            lines.append(f"    {per:>8,.1f}  {site['site']} ({blocks:,} blocks)")
    lines += [
        "",
        "4. event-loop lag (1 ms ticker; lateness per tick) and GC pauses (wall; full passes"
        " also in CPU), objects the collector tracked at the phase's end (most)",
    ]
    lines += _table(
        (
            "phase",
            "ticks",
            "p99 ms",
            "max ms",
            "GCs (full)",
            "GC total ms",
            "GC max ms",
            "full GC CPU max ms",
            "tracked objects",
        ),
        [
            (
                row["phase"],
                f"{row['ticks']:,}",
                f"{row['p99_ms']:.2f}",
                f"{row['max_ms']:.2f}",
                f"{row['gc_collections']:,} ({row['gc_full_collections']})",
                f"{row['gc_total_ms']:.1f}",
                f"{row['gc_max_ms']:.2f}",
                f"{row['gc_full_cpu_max_ms']:.2f}",
                _opt_int(row["tracked_objects"]),
            )
            for row in report["loop_lag"]
        ],
    )
    lines.append("")
    lines += target_lines(
        report["targets"],
        lambda value, unit: f"{value:,.2f} {unit}",
        heading="targets (informational, 2 cores):",
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="timed steps on one session, per synchronous mode (default: %(default)s)",
    )
    parser.add_argument(
        "--sessions",
        type=int,
        default=100,
        help="concurrent sessions in phase 2 (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=20,
        help="prompts per session, one after another, in phase 2 (default: %(default)s)",
    )
    parser.add_argument(
        "--chunk-rounds",
        type=int,
        default=2,
        help="phase 2: rounds the runtime runs before the baseline replays them, in turn"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--idle", type=int, default=10_000, help="idle sessions in phase 3 (default: %(default)s)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=20.0,
        help="time cap in seconds per phase-1 run (default: %(default)s)",
    )
    parser.add_argument(
        "--dir", default=None, help="where temp data dirs go (default: the system temp dir)"
    )
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="skip gc.freeze() after start-up (sessionrt serve freezes; without it the"
        " loop lag includes the cyclic collector walking start-up objects)",
    )
    parser.add_argument(
        "--stalls",
        type=float,
        default=0.0,
        metavar="MS",
        help="report each callback that holds the loop MS ms or more, and where (stderr;"
        " scripts/_stalls.py)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if min(args.steps, args.sessions, args.rounds, args.chunk_rounds) < 1 or args.budget <= 0:
        parser.error("--steps, --sessions, --rounds, --chunk-rounds and --budget must be positive")
    if args.idle < IDLE_PROMPTED:
        parser.error(f"--idle must be at least {IDLE_PROMPTED}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(
        lambda: run(args), render, as_json=args.json, hard_limit_s=2 * args.budget + 600
    )


if __name__ == "__main__":
    sys.exit(main())
