#!/usr/bin/env python3
"""Resident memory of a real ``sessionrt serve`` after many large prompts, next to its idle size.

    .venv/bin/python scripts/bench_memory.py                 # table
    .venv/bin/python scripts/bench_memory.py --json          # one JSON object on stdout
    .venv/bin/python scripts/bench_memory.py --prompts 150 --prompt-bytes 1000000

Starts ``sessionrt serve --port 0`` on a fresh temp data dir as a subprocess (the
scripted model, no network), waits for "listening on", sends one small request
and reads the server's RSS (``VmRSS`` in ``/proc/<pid>/status``): that is the
**baseline**, the idle server in the same run. Then one session gets ``--prompts``
prompts of ``--prompt-bytes`` of text each (``resume`` on, so every prompt runs a
step: the runner reloads the whole history, which goes through the decode caches
of ``storage/queries.py`` and the chat cache of ``actors/session/history.py``), each
followed by ``POST .../wait``; the transcript is read once more at the end
(``GET .../message`` and ``.../context``). RSS is read again, and its peak
(``VmHWM``), both before the transcript is read (the prompts' peak) and after.
Targets: RSS after 150 x 1 MB prompts <= 150 MiB (issue #8); the prompts' peak
<= 2x the bytes of the prompts (issue #42).
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
from _benchlib import report_main, target_lines

ROOT: Final = Path(__file__).resolve().parent.parent
SESSIONRT: Final = ROOT / ".venv" / "bin" / "sessionrt"
TARGET_RSS_MIB: Final = 150.0
#: Issue #42 section 2: the peak while the prompts go in, at most twice their bytes.
TARGET_PEAK_OF_DATA: Final = 2.0
MIB: Final = 1024 * 1024


def _status(pid: int, key: str) -> float:
    """A ``/proc/<pid>/status`` size in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no {key} in /proc/{pid}/status")
    return int(found.group(1)) / 1024


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


async def _started(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError("sessionrt serve exited before it was listening")
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return found.group(1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        data = Path(tmp) / "data"
        work = Path(tmp) / "work"
        work.mkdir()
        proc = await asyncio.create_subprocess_exec(
            str(SESSIONRT),
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data),
            stdout=asyncio.subprocess.PIPE,
            cwd=work,
        )
        try:
            base = await asyncio.wait_for(_started(proc), 60)
            return await _measure(args, proc.pid, base, str(work))
        finally:
            proc.terminate()
            await proc.wait()


async def _measure(args: argparse.Namespace, pid: int, base: str, work: str) -> dict[str, Any]:
    json_headers = {"Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(base, timeout=timeout, headers=json_headers) as http:
        async with http.post("/api/session", json={"location": {"directory": work}}) as r:
            assert r.status == 200, await r.text()
            sid = (await r.json())["data"]["id"]
        await asyncio.sleep(0.5)  # let start-up settle before the baseline is read
        idle = _status(pid, "VmRSS")
        _log(args, f"idle RSS {idle:.1f} MiB; sending {args.prompts} prompts")
        started = time.perf_counter()
        for i in range(args.prompts):
            # Distinct texts: nothing can be shared between prompts.
            text = f"{i:08d} " + "x" * (args.prompt_bytes - 9)
            body = {"text": text, "resume": True}
            async with http.post(f"/api/session/{sid}/prompt", json=body) as r:
                assert r.status == 200, await r.text()
            async with http.post(f"/api/experimental/session/{sid}/wait") as r:
                assert r.status == 204, await r.text()
            if (i + 1) % 25 == 0:
                _log(
                    args,
                    f"  {i + 1} prompts, RSS {_status(pid, 'VmRSS'):.1f} MiB,"
                    f" peak {_status(pid, 'VmHWM'):.1f} MiB",
                )
        seconds = time.perf_counter() - started
        prompts_peak = _status(pid, "VmHWM")
        async with http.get(f"/api/session/{sid}/context") as r:
            assert r.status == 200
            context = len((await r.json())["data"])
        after = _status(pid, "VmRSS")
        peak = _status(pid, "VmHWM")
        data = args.prompts * args.prompt_bytes / MIB
    return {
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "prompts": args.prompts,
        "prompt_bytes": args.prompt_bytes,
        "seconds": round(seconds, 2),
        "context_messages": context,
        "idle_rss_mib": round(idle, 1),
        "rss_mib": round(after, 1),
        "peak_rss_mib": round(peak, 1),
        "prompts_peak_rss_mib": round(prompts_peak, 1),
        "data_mib": round(data, 1),
        "figures": [
            _figure(
                f"RSS after {args.prompts} x {args.prompt_bytes / 1e6:g} MB prompts",
                after,
                idle,
                f"<= {TARGET_RSS_MIB:g} MiB",
                after <= TARGET_RSS_MIB,
            ),
            _figure("peak RSS (VmHWM) during the run", peak, idle, None, None),
            _figure(
                "peak RSS (VmHWM) over the prompts, before the transcript is read",
                prompts_peak,
                idle,
                f"<= {TARGET_PEAK_OF_DATA:g}x the prompts' {data:,.0f} MiB",
                prompts_peak <= TARGET_PEAK_OF_DATA * data,
            ),
        ],
        "targets": [
            {
                "name": f"RSS after {args.prompts} prompts <= {TARGET_RSS_MIB:g} MiB",
                "value": round(after, 1),
                "unit": "MiB",
                "pass": after <= TARGET_RSS_MIB,
            },
            {
                "name": f"peak RSS over the prompts <= {TARGET_PEAK_OF_DATA:g}x their data",
                "value": round(prompts_peak, 1),
                "unit": "MiB",
                "pass": prompts_peak <= TARGET_PEAK_OF_DATA * data,
            },
        ],
    }


def _figure(
    name: str, value: float, idle: float, target: str | None, passed: bool | None
) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 1),
        "unit": "MiB",
        "baseline": round(idle, 1),
        "baseline_label": "idle server",
        "ratio": round(value / idle, 2) if idle else None,
        "target": target,
        "pass": passed,
    }


def _num(value: float, unit: str) -> str:
    return f"{value:,.1f} {unit}"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sessionrt memory benchmark: {report['prompts']} prompts of {report['prompt_bytes']:,}"
        f" bytes in {report['seconds']:.1f} s, Python {report['python']},"
        f" SQLite {report['sqlite_version']}, {report['cpus']} CPUs",
        "",
    ]
    for f in report["figures"]:
        lines.append(
            f"  {f['name']}: {_num(f['value'], 'MiB')}"
            f" (baseline {_num(f['baseline'], 'MiB')}, {f['baseline_label']}; {f['ratio']:.2f}x)"
        )
    lines.append("")
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, default=150)
    parser.add_argument("--prompt-bytes", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(lambda: asyncio.run(run(args)), render, as_json=args.json, hard_limit_s=1800)


if __name__ == "__main__":
    sys.exit(main())
