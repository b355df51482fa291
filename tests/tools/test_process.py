"""Process groups named across a crash: kill_stale kills ours and never a stranger.

Real processes: each test starts its own group with ``start_new_session`` and
kills whatever is left at teardown.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from proc_groups import Spawn, alive, own_groups

from actors.tools import ProcessGroup
from actors.tools._process import group_alive, identify, kill_stale


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    with own_groups(tmp_path) as start:
        yield start


def test_identify_names_the_group_by_its_leaders_start_time(spawn: Spawn) -> None:
    proc = spawn("exec sleep 30")
    group = identify(proc.pid)
    assert group is not None
    stat = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
    assert group.pgid == proc.pid
    assert group.start_ticks == int(stat[19])  # field 22
    assert group.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_a_recorded_group_is_killed_with_every_member(spawn: Spawn) -> None:
    proc = spawn("sleep 30 & echo $!; sleep 30")
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    group = identify(proc.pid)
    assert group is not None
    assert kill_stale([group], 0.5) == [group]
    assert not group_alive(proc.pid)
    assert proc.wait() == -signal.SIGTERM
    assert not alive(child)


@pytest.mark.parametrize(
    "change",
    [{"start_ticks": 1}, {"boot_id": "another-boot"}],
    ids=["another start time", "another boot"],
)
def test_a_group_whose_number_was_reused_is_left_alone(
    spawn: Spawn, change: dict[str, object]
) -> None:
    # What pid reuse looks like: a live process holds the recorded number, but it
    # is not the process we recorded.
    stranger = spawn("exec sleep 30")
    group = identify(stranger.pid)
    assert group is not None
    recorded = attrs.evolve(group, **change)  # type: ignore[arg-type]
    assert kill_stale([recorded], 0.5) == []
    assert group_alive(stranger.pid)
    assert stranger.poll() is None


def test_what_is_left_of_a_group_whose_leader_exited_is_killed(spawn: Spawn) -> None:
    leader = spawn("sleep 30 & echo $!; read -r done")
    assert leader.stdout is not None
    assert leader.stdin is not None
    child = int(leader.stdout.readline())
    group = identify(leader.pid)
    assert group is not None
    leader.stdin.close()  # the leader exits; its background sleep stays in the group
    leader.wait()  # reaped: the number names no process now, only the group
    assert group_alive(group.pgid)
    assert kill_stale([group], 0.5) == [group]
    assert not group_alive(group.pgid)
    assert not alive(child)


def test_a_group_that_is_gone_is_nothing_to_kill() -> None:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    gone = ProcessGroup(pgid=2**22 + 12345, start_ticks=1, boot_id=boot)
    assert kill_stale([gone], 0.5) == []
