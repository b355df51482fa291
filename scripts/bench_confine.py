#!/usr/bin/env python3
"""What confinement costs: the directory check at create, a confined file attachment.

    .venv/bin/python scripts/bench_confine.py            # table
    .venv/bin/python scripts/bench_confine.py --json     # one JSON object on stdout
    .venv/bin/python scripts/bench_confine.py -n 500

One process, one loop, a fresh temp data dir, the store at ``synchronous=NORMAL``
(fsync would hide a few syscalls). Each figure alternates with its baseline from
the same run, so both see the same disk and load:

1. **Create.** ``Sessions.create`` with the runtime's :class:`DirectoryRules`
   (a worker-thread hop, ``realpath`` and ``stat``) vs. a facade whose check is a
   no-op run inline: what the check adds per create.
2. **Attachment.** A prompt with a 4 KiB ``file:`` attachment inside the session's
   directory (session read, thread hop, resolve, withheld check, open, read) vs.
   the same bytes sent inline as ``data``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _benchlib import report_main

from actors import BlockingExecutor
from actors.files.locations import DirectoryRules
from actors.sessions import Sessions
from protocol.requests import CreateSessionInput, FileInput, PromptInput
from protocol.shapes import Location
from storage import SQLiteStore


class _NoCheck:
    data_dir = None

    def check(self, directory: str) -> None:
        return None


async def _inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


async def _measure(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_confine-") as tmp:
        base = Path(tmp)
        project = base / "project"
        project.mkdir()
        (base / "data").mkdir()
        payload = bytes(range(256)) * 16
        (project / "a.bin").write_bytes(payload)
        inline = base64.b64encode(payload).decode()
        location = CreateSessionInput(location=Location(directory=str(project)))
        async with (
            SQLiteStore(base / "data" / "db.sqlite", synchronous="NORMAL") as store,
            BlockingExecutor(limit=4) as runner,
        ):
            rules = DirectoryRules(data_dir=base / "data")
            checked = Sessions(store, blocking=runner.run, directories=rules)
            bare = Sessions(store, blocking=_inline, directories=_NoCheck())  # type: ignore[arg-type]
            create: list[float] = []
            create_base: list[float] = []
            for _ in range(n):
                t = time.perf_counter()
                await checked.create(location)
                create.append(time.perf_counter() - t)
                t = time.perf_counter()
                await bare.create(location)
                create_base.append(time.perf_counter() - t)
            session = await checked.create(location)
            by_uri = PromptInput(
                text="x",
                resume=False,
                files=(FileInput(uri=(project / "a.bin").as_uri(), mime="application/x"),),
            )
            by_data = PromptInput(
                text="x", resume=False, files=(FileInput(data=inline, mime="application/x"),)
            )
            attach: list[float] = []
            attach_base: list[float] = []
            for _ in range(n):
                t = time.perf_counter()
                await checked.prompt(session.id, by_uri)
                attach.append(time.perf_counter() - t)
                t = time.perf_counter()
                await checked.prompt(session.id, by_data)
                attach_base.append(time.perf_counter() - t)
    return {
        "n": n,
        "create_us": _us(create),
        "create_baseline_us": _us(create_base),
        "attachment_us": _us(attach),
        "attachment_baseline_us": _us(attach_base),
    }


def _render(report: dict[str, Any]) -> str:
    rows = [
        ("session create (median)", report["create_us"], report["create_baseline_us"]),
        ("prompt, 4 KiB file: (median)", report["attachment_us"], report["attachment_baseline_us"]),
    ]
    lines = [f"bench_confine: n={report['n']} each, synchronous=NORMAL"]
    lines.append(f"  {'figure':<30} {'value µs':>10} {'baseline µs':>12} {'added µs':>10}")
    for name, value, baseline in rows:
        lines.append(f"  {name:<30} {value:>10} {baseline:>12} {value - baseline:>10.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=300, help="samples per figure")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return report_main(
        lambda: asyncio.run(_measure(args.n)), _render, as_json=args.json, hard_limit_s=300
    )


if __name__ == "__main__":
    sys.exit(main())
