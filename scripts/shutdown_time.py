#!/usr/bin/env python3
"""How long Ctrl-C on ``sessionrt serve`` takes while bash tools run, and what survives it.

    .venv/bin/python scripts/shutdown_time.py                  # 8 tools running `sleep 30`
    .venv/bin/python scripts/shutdown_time.py 8 "trap '' TERM; sleep 30 & sleep 30"

Starts a real ``sessionrt serve`` on a temporary data dir, starts one bash tool
call in each of N sessions, waits until every call's process group is recorded
(``session.tool.spawned`` on each session's log) and a moment more, sends SIGINT
and reports the time until the server has exited, and how many of the tools'
process groups are still alive (should be 0). A command that ignores SIGTERM
costs the bash tool's kill grace (0.5 s) before its SIGKILL; the groups are
killed concurrently, so N such tools cost about the same as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from actors.tools._process import group_alive
from protocol.client import Client, follow_log
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location

EXE = str(Path(sys.executable).with_name("sessionrt"))


async def measure(n: int, command: str, tmp: Path) -> tuple[float, int, int | None]:
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(tmp / "data"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    pgids: list[int] = []
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        found = re.search(r"http://\S+", line)
        if found is None:
            raise RuntimeError(f"no listening line: {line!r}")
        async with Client(found.group(0)) as client:

            async def one() -> None:
                where = Location(directory=str(tmp))
                s = await client.sessions.create(CreateSessionInput(location=where))
                async with contextlib.aclosing(follow_log(client.sessions, s.id)) as log:
                    text = "#tool bash " + json.dumps({"command": command, "timeout_s": 600})
                    await client.sessions.prompt(s.id, PromptInput(text=text))
                    async for event in log:
                        if event.event == "session.tool.spawned":
                            pgids.append(int(event.data["data"]["pgid"]))
                            return

            await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 60)
        await asyncio.sleep(0.3)  # let the commands get going past their gate
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
        return time.monotonic() - started, sum(group_alive(p) for p in pgids), proc.returncode
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    command = sys.argv[2] if len(sys.argv) > 2 else "sleep 30"
    tmp = Path(tempfile.mkdtemp(prefix="sessionrt-shutdown-"))
    try:
        seconds, alive, code = asyncio.run(measure(n, command, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{n} tools running {command!r}: serve exited {code} {seconds * 1000:.0f} ms"
        f" after SIGINT; process groups still alive: {alive}"
    )
    return 0 if alive == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
