"""Process groups a test starts itself (as a dead server's tool would have), all reaped after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from actors.tools._process import group_alive

Spawn = Callable[[str], subprocess.Popen[bytes]]


def alive(pid: int) -> bool:
    """Running: a zombie (an orphan an init that never reaps left behind) is not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@contextlib.contextmanager
def own_groups(cwd: Path) -> Iterator[Spawn]:
    """``start(command)`` runs ``sh -c command`` in a new session; every group is killed at exit."""
    started: list[subprocess.Popen[bytes]] = []

    def start(command: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                assert pipe is not None
                pipe.close()
