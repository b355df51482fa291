"""A test process that is killed outright or terminated takes what it started with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from proc_groups import alive

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# A stand-in for a test process: it spawns the way the suite's processes do (the
# Popen patch of note_spawned), a server-like session leader with a child of its
# own, prints their pids, then waits for its stdin (never closed by us).
STAND_IN = textwrap.dedent(
    """
    import subprocess, sys
    import proc_groups
    proc_groups.note_spawned()
    proc_groups.reap_on_termination()
    leader = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 600 & echo $!; wait"],
        stdout=subprocess.PIPE, start_new_session=True,
    )
    print(leader.pid, leader.stdout.readline().decode().strip(), flush=True)
    sys.stdin.read()
    """
)


def start_stand_in() -> tuple[subprocess.Popen[str], int, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", STAND_IN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # our own Ctrl-C is not its
    )
    assert proc.stdout is not None
    leader, grandchild = (int(p) for p in proc.stdout.readline().split())
    return proc, leader, grandchild


def gone(pid: int, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds  # a poll: a kill lands asynchronously
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not alive(pid)


def finish(proc: subprocess.Popen[str], *pids: int) -> None:
    for pid in pids:  # whatever the assertions saw, nothing outlives the test
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        assert pipe is not None
        pipe.close()


def test_a_test_process_killed_outright_takes_its_children_with_it() -> None:
    proc, leader, grandchild = start_stand_in()
    try:
        assert alive(leader)
        assert alive(grandchild)
        proc.kill()  # SIGKILL: no atexit, no finally
        proc.wait()
        assert gone(leader)  # PR_SET_PDEATHSIG, set before exec
    finally:
        finish(proc, leader, grandchild)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_test_process_kills_what_it_started_and_ends_by_the_signal(
    signum: signal.Signals,
) -> None:
    proc, leader, grandchild = start_stand_in()
    try:
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == -signum  # ended by it, as it would have
        assert gone(leader)
        assert gone(grandchild)  # the leader's whole session, not only the leader
    finally:
        finish(proc, leader, grandchild)
