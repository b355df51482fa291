"""``sessionrt`` under tracemalloc, for scripts/bench_memory.py ``--tracemalloc``.

    .venv/bin/python scripts/_traced_serve.py OUT serve --port 0 ...

Starts tracemalloc (``TRACE_FRAMES`` frames per allocation), then runs the
``sessionrt`` command line with the remaining arguments. On SIGUSR1 it writes
the largest live allocation sites (grouped by traceback) to ``OUT`` as JSON,
then ``OUT.done``: the benchmark reads them while the server keeps running.
A measuring tool, not part of the server: tracemalloc slows every allocation.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tracemalloc
from types import FrameType
from typing import Final

TRACE_FRAMES: Final = 8
TOP: Final = 25


def _dump(out: str) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),)
    )
    traced, peak = tracemalloc.get_traced_memory()
    sites = [
        {
            "mib": round(stat.size / 2**20, 2),
            "count": stat.count,
            "where": [f"{frame.filename}:{frame.lineno}" for frame in stat.traceback],
        }
        for stat in snapshot.statistics("traceback")[:TOP]
    ]
    with open(out, "w") as f:
        json.dump({"traced_mib": traced / 2**20, "peak_mib": peak / 2**20, "top": sites}, f)
    with open(out + ".done", "w"):
        pass


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    tracemalloc.start(TRACE_FRAMES)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _dump(out)

    signal.signal(signal.SIGUSR1, on_signal)
    from server.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
