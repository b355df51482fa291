"""Process groups a test starts itself (as a dead server's tool would have), all reaped after."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scripts_loader import load_script

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


# -- what the suite started, reaped whatever way it ends -----------------------------------------
# A test that is interrupted (Ctrl-C, a timeout) does not reach the end of an async
# fixture: the loop stops with the KeyboardInterrupt and the fixture's ``finally``,
# which would await the process, never runs. So every child the test process spawns
# is noted here, and ``reap_all`` (tests/conftest.py: at the session's end and at
# exit, which a KeyboardInterrupt still reaches) kills what is left of them.

#: (pid, whether it leads a session of its own) of every child this process spawned.
_spawned: list[tuple[int, bool]] = []
_note_installed = False


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state is [0], ppid [1], sid [3])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def note_spawned(*, record: bool = True) -> None:
    """Note every child ``subprocess.Popen`` starts from now on (asyncio's too), unless
    ``record`` is false (xdist's controller, whose children are the workers).

    A child started from the main thread also dies with this process (``PR_SET_PDEATHSIG``,
    scripts/_children.py): a test process killed outright, which runs no ``atexit``,
    leaves no server behind. A thread's children are left alone: the thread may end
    before them (the runtime's tool threads, in process).
    """
    global _note_installed
    if _note_installed:
        return
    _note_installed = True
    init = subprocess.Popen.__init__
    die_with_parent = load_script("_children").die_with_parent

    def noting(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        command = args[0] if args else kwargs.get("args")
        if (
            threading.current_thread() is threading.main_thread()
            and isinstance(command, list | tuple)
            and not kwargs.get("shell")
            and "executable" not in kwargs
        ):
            args = (die_with_parent([os.fspath(a) for a in command]), *args[1:])
            kwargs.pop("args", None)
        init(self, *args, **kwargs)
        if not record:
            return
        leader = bool(kwargs.get("start_new_session")) or kwargs.get("process_group") == 0
        _spawned.append((self.pid, leader))

    subprocess.Popen.__init__ = noting  # type: ignore[method-assign]


def reap_on_termination() -> None:
    """SIGTERM or SIGHUP (a CI runner's cancel, a closed terminal) run no ``atexit``:
    kill what this process started, then end by the signal as it would have."""

    def terminated(signum: int, frame: object) -> None:
        reap_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, terminated)


def reap_all() -> list[int]:
    """SIGKILL every process left of what this process spawned; the pids killed.

    A child that leads a session of its own takes its whole session with it (what
    it started, such as a harness's ``sessionrt serve``, even orphaned); another
    child is killed only while it is still this process's child, so a pid reused
    by a stranger is never touched.
    """
    me = os.getpid()
    sessions = {pid for pid, leader in _spawned if leader}
    children = {pid for pid, leader in _spawned if not leader}
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        fields = _stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) in sessions or (pid in children and int(fields[1]) == me):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    _spawned.clear()
    return killed


def kill_group(proc: subprocess.Popen[Any] | asyncio.subprocess.Process) -> None:
    """SIGKILL the process group ``proc`` leads (started with ``start_new_session=True``):
    it and whatever it started; nothing when they are all gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_in_group(
    args: list[str], *, timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True)`` in a session of its own,
    whose whole group is killed however the call ends (a timeout, a KeyboardInterrupt):
    ``subprocess.run`` kills only the child, and a harness's servers outlived it."""
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)
