#!/usr/bin/env python3
"""Where one prompt -> final turn on the scripted model spends the server's CPU, by phase.

    .venv/bin/python scripts/profile_turn.py                 # 300 turns, one session
    .venv/bin/python scripts/profile_turn.py --turns 500 --profile /tmp/turn.prof

One process, one loop, a fresh temp data dir (``synchronous=FULL``), the scripted
model at zero delay: ``sessions.prompt(..., resume=False)`` then
``execution.resume(sid)``, as ``scripts/bench_runtime.py`` phase 1 does, ``--turns``
times on one session after ``--warmup`` turns. It prints the process CPU per turn
(``time.process_time``: the loop's and every thread's) and, from a ``cProfile``
of the loop's thread (CPU time) over as many turns again, the cumulative time per turn of each
phase's entry point (admission, instruction admission, promotion, request build,
the model stream, step events, settlement): under the profiler, so the figures
are inflated alike and their shares are what to compare. Benchmark-only; issue
#42 section 6.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Final

from bench_runtime import RecordingProvider, open_runtime, runtime_step

#: (phase, (file suffix, function name)...): the entry points whose cumulative time is a phase.
PHASES: Final = (
    ("admission (sessions.prompt)", (("actors/sessions.py", "prompt"),)),
    ("drain (the session's busy period)", (("actors/session/drain.py", "drain"),)),
    ("  promotion (inbox.promote)", (("actors/session/inbox.py", "promote"),)),
    ("  drain start read", (("storage/queries.py", "drain_start"),)),
    ("  agent load", (("actors/session/drain.py", "_agent"),)),
    ("  step (step.run)", (("actors/session/step.py", "run"),)),
    ("    step inputs (session + history read)", (("storage/queries.py", "step_inputs"),)),
    (
        "    instruction admission (prepare)",
        (("actors/session/instruction_admission.py", "prepare"),),
    ),
    ("    request build", (("actors/session/drain.py", "_request"),)),
    ("    model stream", (("actors/session/step.py", "_stream"),)),
    (
        "    step events (emit/flushed)",
        (("actors/session/step.py", "emit"), ("actors/session/step.py", "flushed")),
    ),
    ("    step end", (("actors/session/step.py", "_end"),)),
    ("  settlement (runtime.settled)", (("actors/runtime.py", "settled"),)),
    ("store: append on the loop (encode)", (("storage/sqlite.py", "append"),)),
    ("store: reads on the loop", (("storage/_inline_reads.py", "fetch_many"),)),
    ("store: batch done (futures, subscribers)", (("storage/sqlite.py", "_batch_done"),)),
)


async def turns(args: argparse.Namespace, root: Path) -> dict[str, float]:
    provider = RecordingProvider()
    async with open_runtime(root, "turn", "FULL", provider) as rt:
        sid = (await rt.sessions.create()).id
        for i in range(args.warmup):
            await runtime_step(rt, sid, f"warm-up {i}")
        threads0 = _thread_cpu()
        cpu0, loop0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        for i in range(args.turns):
            await runtime_step(rt, sid, f"Summarise the build, step {i}.")
        cpu, loop = time.process_time() - cpu0, time.thread_time() - loop0
        wall = time.perf_counter() - wall0
        for name, spent in sorted(_thread_cpu().items()):
            extra = (spent - threads0.get(name, 0.0)) / args.turns * 1000
            if extra >= 0.01:
                print(f"  thread {name}: {extra:.3f} ms CPU per turn")
        if args.profile:
            # CPU time of the loop's thread, not wall time: on a shared machine the
            # wall clock mostly measures waiting for a core.
            profiler = cProfile.Profile(time.thread_time)
            profiler.enable()
            for i in range(args.turns):
                await runtime_step(rt, sid, f"Summarise the build, profiled step {i}.")
            profiler.disable()
            profiler.dump_stats(args.profile)
    n = args.turns
    return {"cpu": cpu / n * 1000, "loop": loop / n * 1000, "wall": wall / n * 1000}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per live thread, by name (threads of one name summed)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            spent = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):
            continue
        name = thread.name.split(":", 1)[0]
        out[name] = out.get(name, 0.0) + spent
    return out


def phases(path: str, turns: int) -> list[tuple[str, float]]:
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    out = []
    for name, points in PHASES:
        total = 0.0
        for suffix, func in points:
            for (filename, _, fname), (_, _, _, cum, _) in stats.items():
                if fname == func and filename.endswith(suffix):
                    total += cum
        out.append((name, total / turns * 1000))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile", default="", help="also profile the turns; write stats here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="profile_turn-") as directory:
        result = asyncio.run(turns(args, Path(directory)))
    print(f"turns: {args.turns} (after {args.warmup} warm-up), one session, FULL")
    print(f"  process CPU per turn:     {result['cpu']:.3f} ms")
    print(f"  loop thread CPU per turn: {result['loop']:.3f} ms")
    print(f"  wall per turn:            {result['wall']:.3f} ms")
    if args.profile:
        print("  phases, loop-thread CPU ms per turn under cProfile (inflated by it):")
        for name, ms in phases(args.profile, args.turns):
            print(f"    {ms:8.3f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
