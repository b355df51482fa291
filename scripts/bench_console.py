#!/usr/bin/env python3
"""The web console's figures, measured in one run against one real server.

1. First paint: navigation to the transcript on screen (``performance.now()``
   when the page has rendered the session, set by the console itself) in
   headless Chromium, for a session of ``--messages`` messages against an
   empty session (the baseline, same run, same browser). Target: <= 500 ms.
2. Server cost of consoles following the instance feed: the same workload
   (``--prompts`` streamed answers in another session) with no console open,
   then with ``--consoles`` open pages, each following ``/api/event``; server
   CPU seconds (utime+stime from /proc) and RSS after each phase.

Run: ``.venv/bin/python scripts/bench_console.py [--json]``. Needs
/usr/bin/chromium and playwright (the test extra). Figures are for reading,
not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from _benchlib import report_main, target_lines

CHROMIUM = "/usr/bin/chromium"
EXE = str(Path(sys.executable).with_name("sessionrt"))
TARGET_PAINT_MS = 500.0
ANSWER = "#chunk 4\n#text " + "streamed words for the feed " * 8


def _call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def _count_messages(url: str, sid: str) -> int:
    total, cursor = 0, None
    while True:
        query = f"?cursor={cursor}" if cursor else "?limit=200"
        page = _call(url, "GET", f"/api/session/{sid}/message{query}")
        total += len(page["data"])
        cursor = page["cursor"].get("next")
        if not cursor:
            return total


def _fill(url: str, sid: str, messages: int) -> int:
    """Prompts with short answers until the session holds ``messages`` messages."""
    count = 0
    while count < messages:
        for _ in range(max(1, (messages - count) // 2)):
            _call(url, "POST", f"/api/session/{sid}/prompt", {"text": "#text a short answer"})
            _call(url, "POST", f"/api/experimental/session/{sid}/wait")
        count = _count_messages(url, sid)
    return count


def _feed_subscribers(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        text = response.read().decode()
    match = re.search(r'^sessionrt_sse_subscribers\{stream="event"\} (\S+)$', text, re.M)
    return int(float(match.group(1))) if match else -1


def _cpu_rss(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return cpu, rss * 1024


def _workload(url: str, sid: str, prompts: int) -> float:
    started = time.perf_counter()
    for _ in range(prompts):
        _call(url, "POST", f"/api/session/{sid}/prompt", {"text": ANSWER})
        _call(url, "POST", f"/api/experimental/session/{sid}/wait")
    return time.perf_counter() - started


async def _paint(browser: Any, url: str, sid: str) -> float:
    page = await browser.new_page()
    await page.goto(f"{url}/#{sid}")
    await page.wait_for_selector(f'body[data-ready="{sid}"]', state="attached", timeout=60_000)
    ms = float(await page.get_attribute("body", "data-ready-ms") or "nan")
    await page.close()
    return ms


async def _measure(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    big = _call(url, "POST", "/api/session", {"title": "big"})["data"]["id"]
    empty = _call(url, "POST", "/api/session", {"title": "empty"})["data"]["id"]
    work = _call(url, "POST", "/api/session", {"title": "work"})["data"]["id"]
    held = await asyncio.to_thread(_fill, url, big, args.messages)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            await _paint(browser, url, empty)  # warm the browser's caches once
            baseline = [await _paint(browser, url, empty) for _ in range(args.repeat)]
            loaded = [await _paint(browser, url, big) for _ in range(args.repeat)]
            phases: dict[str, Any] = {}
            cpu0, _ = _cpu_rss(pid)
            wall = await asyncio.to_thread(_workload, url, work, args.prompts)
            cpu1, rss1 = _cpu_rss(pid)
            phases["no consoles"] = {"cpu_s": cpu1 - cpu0, "rss": rss1, "wall_s": wall}
            # One browser context per console: each is its own user with its
            # own feed stream (tabs of one context share one, see console-feed.js).
            contexts = []
            for _ in range(args.consoles):
                context = await browser.new_context()
                page = await context.new_page()
                await page.goto(url + "/")
                await page.wait_for_selector("#feed-state.live", timeout=60_000)
                contexts.append(context)
            await asyncio.sleep(1.0)
            cpu2, _ = _cpu_rss(pid)
            wall = await asyncio.to_thread(_workload, url, work, args.prompts)
            cpu3, rss3 = _cpu_rss(pid)
            phases[f"{args.consoles} consoles"] = {
                "cpu_s": cpu3 - cpu2,
                "rss": rss3,
                "wall_s": wall,
            }
            await context.close()
        finally:
            await browser.close()
    paint_ms = statistics.median(loaded)
    base_ms = statistics.median(baseline)
    alone = phases["no consoles"]
    many = phases[f"{args.consoles} consoles"]
    figures: list[dict[str, Any]] = [
        {
            "name": f"first paint, {held} messages",
            "value": paint_ms,
            "unit": "ms",
            "baseline": base_ms,
            "baseline_label": "empty session",
            "ratio": paint_ms / base_ms if base_ms else None,
            "target": f"<= {TARGET_PAINT_MS:.0f} ms",
            "pass": paint_ms <= TARGET_PAINT_MS,
        },
        {
            "name": f"server cpu, {args.prompts} answers, {args.consoles} consoles open",
            "value": many["cpu_s"],
            "unit": "s",
            "baseline": alone["cpu_s"],
            "baseline_label": "no console",
            "ratio": many["cpu_s"] / alone["cpu_s"] if alone["cpu_s"] else None,
        },
        {
            "name": f"server rss, {args.consoles} consoles open",
            "value": many["rss"] / 2**20,
            "unit": "MiB",
            "baseline": alone["rss"] / 2**20,
            "baseline_label": "no console",
            "ratio": many["rss"] / alone["rss"] if alone["rss"] else None,
        },
    ]
    return {
        "figures": figures,
        "messages": held,
        "first_paint_ms": {
            "empty session (baseline)": statistics.median(baseline),
            f"{held} messages": paint_ms,
            "runs": args.repeat,
        },
        "feed_cost": phases,
        "prompts_per_phase": args.prompts,
        "targets": [
            {
                "name": f"first paint, {held} messages <= {TARGET_PAINT_MS:.0f} ms",
                "value": paint_ms,
                "unit": "ms",
                "pass": paint_ms <= TARGET_PAINT_MS,
            }
        ],
    }


def produce(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        import subprocess

        proc = subprocess.Popen(
            [EXE, "serve", "--port", "0", "--data-dir", str(Path(tmp) / "data")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
            text=True,
        )
        try:
            assert proc.stdout is not None
            match = re.search(r"http://\S+", proc.stdout.readline())
            assert match
            return asyncio.run(_measure(args, match.group(0), proc.pid))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def render(report: dict[str, Any]) -> str:
    lines = [f"console first paint (median of {report['first_paint_ms']['runs']}):"]
    for name, value in report["first_paint_ms"].items():
        if name != "runs":
            lines.append(f"  {name:<28} {value:8.0f} ms")
    lines.append(
        f"server cost of the same workload ({report['prompts_per_phase']} streamed answers):"
    )
    for name, phase in report["feed_cost"].items():
        lines.append(
            f"  {name:<28} cpu {phase['cpu_s']:6.2f} s   rss {phase['rss'] / 2**20:7.1f} MiB"
            f"   wall {phase['wall_s']:6.2f} s"
            + (
                f"   feed streams {phase['feed_subscribers']}"
                if "feed_subscribers" in phase
                else ""
            )
        )
    lines += target_lines(
        report["targets"], lambda v, unit: f"{v:.0f} {unit}", heading="targets (informational):"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--consoles", type=int, default=50)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    # scripts/bench passes it to every benchmark; this one prints no progress anyway.
    parser.add_argument("--quiet", action="store_true", help="no progress (none is printed)")
    args = parser.parse_args()
    return report_main(lambda: produce(args), render, as_json=args.json, hard_limit_s=1200)


if __name__ == "__main__":
    sys.exit(main())
