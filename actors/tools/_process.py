"""Process groups of tool commands: name them durably, kill them whole.

A tool command leads its own session and process group (``start_new_session``),
so everything it starts can be signalled at once with ``killpg``. A group is
named across a crash by a :class:`ProcessGroup`: its id, its leader's start
time (``/proc/<pid>/stat`` field 22, clock ticks since boot) and the kernel's
boot id. A pid, and so a group id, is reused once its process is gone; the
start time and boot id are not, so :func:`kill_stale` never signals a stranger
that happens to hold the number now.

Zombies do not count as members: a killed process whose parent (or an init
that never reaps, as in some containers) has not collected it runs nothing.
Everything here blocks; call it on a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import attrs

__all__ = [
    "GATE",
    "GATE_OPEN",
    "ProcessGroup",
    "group_alive",
    "identify",
    "kill_group",
    "kill_stale",
]

#: A gated command: ``[shell, "-c", GATE, shell, command]`` waits for
#: :data:`GATE_OPEN` on stdin, then becomes ``shell -c command`` with stdin on
#: /dev/null. Without the line (EOF: we closed it, or died) nothing runs and it
#: exits 125. The group exists, and can be recorded, before the command runs.
GATE: Final = 'read -r go || exit 125; exec </dev/null; exec "$0" -c "$1"'
GATE_OPEN: Final = b"go\n"

_PROC: Final = Path("/proc")
_BOOT_ID: Final = _PROC / "sys" / "kernel" / "random" / "boot_id"
#: How long a SIGKILLed group may take to disappear before we stop waiting.
_KILL_WAIT_S: Final = 5.0
_POLL_S: Final = 0.01
_FIRST_POLL_S: Final = 0.001


@attrs.frozen(kw_only=True)
class ProcessGroup:
    """One process group, named so that pid reuse cannot make it another one."""

    pgid: int
    #: The leader's start time: ``/proc/<pgid>/stat`` field 22.
    start_ticks: int
    #: ``/proc/sys/kernel/random/boot_id``: ticks count from this boot.
    boot_id: str


@attrs.frozen
class _Stat:
    state: str
    pgrp: int
    session: int
    start_ticks: int


def _stat(pid: int | str) -> _Stat | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # "pid (comm) state ppid pgrp session ... starttime(22) ...": comm may hold
    # spaces and parentheses, so split after its last ")".
    fields = text.rpartition(")")[2].split()
    try:
        return _Stat(fields[0], int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def identify(pid: int) -> ProcessGroup | None:
    """The group that ``pid`` leads, or None where /proc cannot tell (not Linux)."""
    stat, boot = _stat(pid), _boot_id()
    if stat is None or boot is None or stat.pgrp != pid:
        return None
    return ProcessGroup(pgid=pid, start_ticks=stat.start_ticks, boot_id=boot)


def _live_members() -> dict[int, list[tuple[int, _Stat]]]:
    """Live (not zombie) processes by process group."""
    groups: dict[int, list[tuple[int, _Stat]]] = {}
    with contextlib.suppress(OSError):
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            stat = _stat(entry.name)
            if stat is not None and stat.state not in ("Z", "X"):
                groups.setdefault(stat.pgrp, []).append((int(entry.name), stat))
    return groups


def _signalable(pgids: set[int]) -> set[int]:
    """Those of ``pgids`` that still have a member, zombies included (one syscall each)."""
    exist = set()
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        exist.add(pgid)
    return exist


def _alive(pgids: set[int]) -> set[int]:
    """Those of ``pgids`` with a member that still runs (zombies do not count)."""
    exist = _signalable(pgids)
    if not exist or not _PROC.is_dir():
        return exist
    return exist & _live_members().keys()


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (zombies do not count)."""
    return bool(_alive({pgid}))


def _signal(pgid: int, signum: int) -> None:
    # Gone already, or a member we may not signal: both leave nothing for us to do.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _wait_gone(pgids: set[int], seconds: float, reap: Callable[[], object]) -> set[int]:
    """Wait until no group of ``pgids`` has a live member; return those that still do.

    Looks again after 1 ms, then twice as long each time up to 10 ms: a
    signalled process is usually gone within a millisecond or two. The first
    looks are one ``killpg(…, 0)`` each; only once those have not settled it
    are zombies told apart, by a scan of /proc (tens of ms on a busy host):
    an orphan's corpse that nobody reaps must not keep the wait going.
    """
    end = time.monotonic() + seconds
    pause = _FIRST_POLL_S
    while True:
        reap()
        left = _signalable(pgids)
        if left and pause >= _POLL_S:
            left = _alive(left)
        if not left:
            return left
        if time.monotonic() >= end:
            return _alive(left)
        time.sleep(pause)
        pause = min(pause * 2, _POLL_S)


def _terminate(pgids: set[int], grace: float, reap: Callable[[], object]) -> None:
    """SIGTERM every group at once, SIGKILL what is left of them after ``grace``."""
    for pgid in pgids:
        _signal(pgid, signal.SIGTERM)
    left = _wait_gone(pgids, grace, reap)
    for pgid in left:
        _signal(pgid, signal.SIGKILL)
    if left:
        _wait_gone(left, _KILL_WAIT_S, reap)


def kill_group(pgid: int, grace: float, *, reap: Callable[[], object] = lambda: None) -> None:
    """End group ``pgid``: SIGTERM, then SIGKILL after ``grace`` if anything still lives.

    ``reap`` is called while waiting, so a parent can collect its own child
    (which would otherwise linger in the group as a zombie).
    """
    _terminate({pgid}, grace, reap)


def _still_ours(group: ProcessGroup, members: dict[int, list[tuple[int, _Stat]]]) -> bool:
    if group.boot_id != _boot_id():
        return False  # rebooted since: every process of that boot is gone
    leader = _stat(group.pgid)
    if leader is not None:
        # A live process holds the number: ours only if it started when ours did.
        return leader.pgrp == group.pgid and leader.start_ticks == group.start_ticks
    # The leader has exited, but while any member of its group lives the kernel
    # gives the number to no new process, so a group of that id whose members
    # all started no earlier than our leader, in the session our leader
    # created, is what is left of ours.
    left = members.get(group.pgid, [])
    return bool(left) and all(
        s.session == group.pgid and s.start_ticks >= group.start_ticks for _, s in left
    )


def kill_stale(groups: Iterable[ProcessGroup], grace: float) -> list[ProcessGroup]:
    """Kill every group of ``groups`` that is still the one recorded, all at once.

    Returns the groups that were found and killed; a group whose number now
    belongs to another process (another start time, another boot) is left alone.
    """
    members = _live_members()
    ours = [g for g in groups if _still_ours(g, members)]
    if ours:
        _terminate({g.pgid for g in ours}, grace, lambda: None)
    return ours
