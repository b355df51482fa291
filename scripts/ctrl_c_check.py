#!/usr/bin/env python3
"""Ctrl-C at several points of ``scripts/test``: how long it takes to stop, and what it leaves.

    .venv/bin/python scripts/ctrl_c_check.py                       # at 20, 60, 120, 200 s
    .venv/bin/python scripts/ctrl_c_check.py --at 5,45 -- tests/crashsim

For each ``--at`` time: starts ``scripts/test`` of this checkout (extra arguments
after ``--`` go to it) in a process group of its own, as a shell runs a job in
the foreground, waits that many seconds, then sends SIGINT to the whole group,
which is what a terminal's Ctrl-C does. Reported: the seconds from SIGINT until
the group's leader exited (``--grace`` bounds the wait; past it the group is
killed and the point fails), then every process still running whose command line
names this checkout, or whose environment carries the run's marker (a
``sessionrt serve`` a test started, a worker, a tool's process group; a tool
whose environment was scrubbed and whose command names neither is not seen).
Those are killed after being reported. Exit status 1 if any point timed out or
left something behind.

A check for issue #36 ("Ctrl-C at any point leaves no sessionrt process
behind"); load the machine by running a second suite beside it, as the issue
asks. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: In the environment of scripts/test and so of everything it starts that keeps it.
MARKER = f"ctrl-c-{os.getpid()}"
_MARK = f"SESSIONRT_CTRL_C_RUN={MARKER}".encode()


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _marked(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def ours(root: Path, marker: bytes) -> dict[int, str]:
    """Running processes (not this one) that name ``root`` or carry ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        line = _cmdline(pid)
        if (str(root) in line or _marked(pid, marker)) and _running(pid):
            found[pid] = line
    return found


def one_point(at: float, grace: float, extra: list[str], before: set[int]) -> tuple[bool, str]:
    env = dict(os.environ, SESSIONRT_CTRL_C_RUN=MARKER)
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "test"), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a group of its own, like a shell's foreground job
    )
    try:
        try:
            proc.wait(timeout=at)
            return False, f"at {at:g} s: scripts/test had already ended ({proc.returncode})"
        except subprocess.TimeoutExpired:
            pass
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace)
            stopped = time.monotonic() - sent
            ok, verdict = True, f"stopped {stopped:.1f} s after SIGINT (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            ok, verdict = False, f"still running {grace:g} s after SIGINT: killed"
        # The group's other members (workers, mypy) end on their own; give them a moment.
        deadline = time.monotonic() + 10
        left: dict[int, str] = {}
        while time.monotonic() < deadline:
            left = {p: c for p, c in ours(ROOT, _MARK).items() if p not in before}
            if not left:
                break
            time.sleep(0.2)  # a poll for the stragglers, with the deadline above
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left:
            ok = False
            verdict += f"; LEFT {len(left)}: " + "; ".join(
                f"{pid} {line[:120]}" for pid, line in sorted(left.items())
            )
        else:
            verdict += "; nothing left"
        return ok, f"at {at:g} s: {verdict}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--at", default="20,60,120,200", help="seconds after start, comma-separated"
    )
    parser.add_argument("--grace", type=float, default=120.0, help="seconds to wait for the stop")
    parser.add_argument("extra", nargs="*", help="arguments for scripts/test (after --)")
    args = parser.parse_args(argv)
    before = set(ours(ROOT, _MARK))  # whatever was running already is not this run's
    failed = False
    for at in (float(x) for x in args.at.split(",")):
        load = "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
        ok, line = one_point(at, args.grace, args.extra, before)
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {line} (load before: {load})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
