"""The bash tool against real subprocesses: output, exit codes, progress, timeouts, cancellation.

A killed background process is checked with :func:`alive`: ``os.kill(pid, 0)``
raising ``ProcessLookupError`` proves it gone, but an orphan's corpse may wait
as a zombie for an init that never reaps it (as in some containers), so a
zombie counts as gone too.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from actors import BlockingExecutor
from actors.tools import (
    OutputBounding,
    ProcessGroup,
    ToolActors,
    ToolContext,
    ToolError,
    ToolExecutor,
    ToolRegistry,
    builtin_tools,
)
from actors.tools.builtin import BashTool

GUARD = 10.0
#: Starts a background sleep, records its pid, says so, and waits for it.
BACKGROUND = "sleep 60 & echo $! > bg.pid; echo started; wait"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def text_of(result: Any) -> str:
    text: str = result.content[0]["text"]
    return text


@pytest.fixture
def background_pid(location: Path) -> Iterator[Callable[[], int]]:
    """The pid the command wrote to bg.pid; killed at teardown if it is still around."""
    pids: list[int] = []

    def read() -> int:
        pid = int((location / "bg.pid").read_text())
        pids.append(pid)
        return pid

    yield read
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_output_with_stderr_merged(ctx: ToolContext) -> None:
    result = BashTool().run({"command": "echo hello; echo oops >&2"}, ctx)
    assert text_of(result) == "hello\noops\n"
    assert result.metadata == {"exitCode": 0}


def test_runs_in_the_location(location: Path, ctx: ToolContext) -> None:
    assert text_of(BashTool().run({"command": "pwd -P"}, ctx)) == f"{location.resolve()}\n"


def test_no_output_says_so(ctx: ToolContext) -> None:
    assert text_of(BashTool().run({"command": "true"}, ctx)) == "(no output)"


async def test_a_non_zero_exit_is_a_successful_call_with_the_code(
    executor: ToolExecutor, ctx: ToolContext
) -> None:
    outcome = await executor.execute("bash", {"command": "echo failing; exit 3"}, ctx)
    assert outcome.status == "success"
    assert text_of(outcome) == "failing\nExit code: 3"
    assert outcome.metadata == {"exitCode": 3, "truncated": False}


def test_death_by_signal_is_reported(ctx: ToolContext) -> None:
    result = BashTool().run({"command": "kill -9 $$"}, ctx)
    assert text_of(result) == "Terminated by signal 9"
    assert result.metadata == {"exitCode": -9}


def test_output_within_memory_is_kept_whole_and_nothing_is_spilled(
    ctx: ToolContext, output_dir: Path
) -> None:
    result = BashTool(output_memory_bytes=16).run({"command": "printf 0123456789abcdef"}, ctx)
    assert text_of(result) == "0123456789abcdef"
    assert result.saved is None
    assert not output_dir.exists()


LINES = "for i in $(seq 0 199); do echo line $i; done"


def test_output_beyond_memory_streams_to_a_managed_file_keeping_head_and_tail(
    ctx: ToolContext, output_dir: Path
) -> None:
    result = BashTool(output_memory_bytes=200).run({"command": LINES}, ctx)
    full = "".join(f"line {i}\n" for i in range(200))
    # The complete output is in one managed file, byte for byte.
    [saved] = list(output_dir.iterdir())
    assert saved.name.startswith("tool_")
    assert result.saved == saved
    assert saved.read_text() == full
    assert result.saved_bytes == len(full)
    text = text_of(result)
    # Whole lines of the beginning and of the end, a marker between them.
    head, marker, tail = text.split("\n(", 1)[0], *text.split("\n(", 1)[1].split("\n", 1)
    assert full.startswith(head + "\n")
    assert full.endswith(tail)
    assert head.startswith("line 0")
    assert tail.endswith("line 199\n")
    assert f"saved to {saved}" in marker
    omitted = int(marker.split()[1])
    assert omitted == len(full) - len(head) - 1 - len(tail)
    assert len(head) + len(tail) <= 200  # what memory held, nothing more


async def test_a_spilled_result_is_bounded_against_its_file_without_a_second_copy(
    runner: ToolActors, output_dir: Path, ctx: ToolContext
) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=10)
    tools = ToolRegistry([BashTool(output_memory_bytes=400)])
    outcome = await ToolExecutor(tools, runner, bounding).execute("bash", {"command": LINES}, ctx)
    assert outcome.status == "success"
    [saved] = await asyncio.to_thread(lambda: list(output_dir.iterdir()))  # nothing of its own
    assert outcome.metadata["truncated"] is True
    assert outcome.metadata["outputPath"] == str(saved)
    texts = [item["text"] for item in outcome.content]
    assert texts[0].startswith("line 0\n")
    assert texts[-1].rstrip("\n").endswith("line 199")
    markers = [t for t in texts if "truncated; full content saved to" in t]
    assert markers == [
        f"... {markers[0].split()[1]} bytes truncated; full content saved to {saved} ..."
    ]
    assert sum(t.rstrip("\n").count("\n") + 1 for t in texts if t not in markers) <= 10


CHATTY = r"""
import resource, sys
from pathlib import Path
from actors.tools import ToolContext
from actors.tools.builtin import BashTool

directory, output_dir, size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
ctx = ToolContext(session_id="s", call_id="c", assistant_message_id="m",
                  directory=directory, output_dir=output_dir)
BashTool().run({"command": "true"}, ctx)  # warm up: imports, first fork
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = BashTool().run({"command": f"yes | head -c {size}"}, ctx)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before, after, result.saved, result.saved_bytes, len(result.content[0]["text"]))
"""


@pytest.mark.slow
def test_a_chatty_command_keeps_memory_bounded(location: Path, output_dir: Path) -> None:
    size = 50 * 1024 * 1024
    done = subprocess.run(
        [sys.executable, "-c", CHATTY, str(location), str(output_dir), str(size)],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    before_kib, after_kib, saved, saved_bytes, text_len = done.stdout.split()
    # 50 MiB went through; the peak grew by a few MiB at most (1 MiB kept, 64 KiB reads).
    assert int(after_kib) - int(before_kib) < 12 * 1024
    assert int(saved_bytes) == size
    assert Path(saved).stat().st_size == size
    assert int(text_len) < 1_100_000


def test_a_sleep_beyond_its_timeout_is_killed_and_says_it_timed_out(
    ctx: ToolContext, location: Path
) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError) as raised:
        BashTool().run({"command": "echo $$ > leader.pid; sleep 30", "timeout_s": 1}, ctx)
    elapsed = time.monotonic() - start
    assert raised.value.type == "timeout"
    assert raised.value.message.startswith("Command timed out after 1 s:")
    assert "exceeding its timeout (1000 ms)" in raised.value.message
    # It waited its timeout out (it did not stop the command early). How soon after is
    # no assertion: the message above says it stopped on the timeout, not at the sleep's end.
    assert elapsed >= 1.0
    assert not alive(int((location / "leader.pid").read_text()))


def test_a_timeout_asked_above_the_cap_is_clamped_to_it(ctx: ToolContext) -> None:
    tool = BashTool(max_timeout_s=1)
    assert tool.timeout_for({"command": "x", "timeout_s": 3600}, ctx) == 1
    with pytest.raises(ToolError, match="timed out after 1 s") as raised:
        tool.run({"command": "sleep 30", "timeout_s": 3600}, ctx)
    assert raised.value.type == "timeout"


def test_the_configured_default_timeout_applies_when_the_call_names_none(
    ctx: ToolContext,
) -> None:
    tool = BashTool(default_timeout_s=1, max_timeout_s=5)
    assert tool.timeout_for({"command": "x"}, ctx) == 1
    assert tool.timeout_for({"command": "x", "timeout_s": 2.5}, ctx) == 2.5
    with pytest.raises(ToolError, match="timed out after 1 s"):
        tool.run({"command": "sleep 30"}, ctx)
    # Without a configured default, the context's (120 s unless set).
    assert BashTool().timeout_for({"command": "x"}, ctx) == 120


def test_a_missing_location_fails(location: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(directory=location / "missing")
    with pytest.raises(ToolError, match="Could not start"):
        BashTool().run({"command": "true"}, ctx)


def test_a_background_job_holding_the_pipe_does_not_hold_the_call(
    ctx: ToolContext, background_pid: Callable[[], int]
) -> None:
    result = BashTool().run({"command": "sleep 60 & echo $! > bg.pid; echo done"}, ctx)
    assert text_of(result) == "done\n"
    # Returned on bash's exit, not the sleep's: the sleep is still running, left
    # running like a shell would.
    assert alive(background_pid())


def test_progress_streams_output_while_the_command_runs(location: Path, make_ctx: Any) -> None:
    updates: list[str] = []

    def progress(update: Mapping[str, Any]) -> None:
        updates.append(update["output"])
        if "ready" in update["output"]:
            (location / "go").touch()  # the command waits for this file

    ctx = make_ctx(progress=progress)
    command = "echo ready; while [ ! -e go ]; do sleep 0.01; done; echo done"
    result = BashTool().run({"command": command, "timeout_s": GUARD}, ctx)
    assert text_of(result) == "ready\ndone\n"
    assert updates[0] == "ready\n"


def test_progress_is_rate_limited(make_ctx: Any) -> None:
    stamps: list[float] = []
    outputs: list[str] = []

    def progress(update: Mapping[str, Any]) -> None:
        stamps.append(time.monotonic())
        outputs.append(update["output"])

    ctx = make_ctx(progress=progress)
    command = "for i in $(seq 1 40); do echo line$i; sleep 0.01; done"
    result = BashTool(progress_interval_s=0.1).run({"command": command}, ctx)
    assert text_of(result).endswith("line40\n")
    assert stamps
    assert all(b - a >= 0.099 for a, b in itertools.pairwise(stamps))
    # Each update is the output so far: a growing prefix of the final text.
    assert all(text_of(result).startswith(out) for out in outputs)


def test_a_timeout_kills_the_whole_process_group(
    ctx: ToolContext, background_pid: Callable[[], int]
) -> None:
    with pytest.raises(ToolError) as raised:
        BashTool().run({"command": BACKGROUND, "timeout_s": 1}, ctx)
    assert raised.value.type == "timeout"
    assert "timed out after 1 s" in raised.value.message
    assert "started" in raised.value.message  # the partial output
    assert not alive(background_pid())


def test_cancel_kills_the_group_even_a_child_that_ignores_sigterm(
    make_ctx: Any, background_pid: Callable[[], int]
) -> None:
    def progress(update: Mapping[str, Any]) -> None:
        if "trapped" in update["output"] and "started" in update["output"]:
            ctx.cancel.set()

    ctx = make_ctx(progress=progress)
    # The child announces that it ignores SIGTERM, so only the SIGKILL can end it.
    command = "(trap '' TERM; echo trapped; exec sleep 60) & echo $! > bg.pid; echo started; wait"
    with pytest.raises(ToolError) as raised:
        BashTool(kill_grace_s=0.2).run({"command": command, "timeout_s": GUARD}, ctx)
    assert raised.value.type == "aborted"
    assert not alive(background_pid())


def test_an_exception_in_progress_still_kills_the_group(
    make_ctx: Any, background_pid: Callable[[], int]
) -> None:
    def progress(update: Mapping[str, Any]) -> None:
        if "started" in update["output"]:
            raise RuntimeError("progress sink broke")

    ctx = make_ctx(progress=progress)
    with pytest.raises(RuntimeError, match="sink broke"):
        BashTool().run({"command": BACKGROUND, "timeout_s": GUARD}, ctx)
    assert not alive(background_pid())


async def test_cancelling_the_awaiting_task_kills_the_command(
    executor: ToolExecutor,
    blocking: BlockingExecutor,
    make_ctx: Any,
    background_pid: Callable[[], int],
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def progress(update: Mapping[str, Any]) -> None:
        if "started" in update["output"]:
            loop.call_soon_threadsafe(started.set)

    ctx = make_ctx(progress=progress)
    call = asyncio.create_task(executor.execute("bash", {"command": BACKGROUND}, ctx))
    async with asyncio.timeout(GUARD):
        await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert ctx.cancel.is_set()
    assert not await blocking.run(lambda: alive(background_pid()))


async def test_an_invalid_timeout_is_rejected_before_running(
    executor: ToolExecutor, ctx: ToolContext
) -> None:
    outcome = await executor.execute("bash", {"command": "touch ran", "timeout_s": 0}, ctx)
    assert outcome.error is not None
    assert outcome.error["type"] == "invalid-input"
    assert "timeout_s" in outcome.error["message"]


def test_the_group_is_recorded_before_the_command_runs(location: Path, make_ctx: Any) -> None:
    recorded: list[tuple[ProcessGroup, str, bool]] = []

    def spawned(group: ProcessGroup) -> None:
        stat = Path(f"/proc/{group.pgid}/stat").read_text().rpartition(")")[2].split()
        recorded.append((group, stat[19], (location / "ran").exists()))

    ctx = make_ctx(spawned=spawned)
    result = BashTool().run({"command": "echo $$ > pid; touch ran; echo ok"}, ctx)
    assert text_of(result) == "ok\n"
    [(group, start_ticks, ran)] = recorded
    assert not ran  # the command waited behind the gate while the group was recorded
    # The command is the very process recorded: same pid, same start time, own group.
    assert group.pgid == int((location / "pid").read_text())
    assert group.start_ticks == int(start_ticks)


def test_a_group_that_cannot_be_recorded_never_runs_the_command(
    location: Path, make_ctx: Any
) -> None:
    pgids: list[int] = []

    def spawned(group: ProcessGroup) -> None:
        pgids.append(group.pgid)
        raise ToolError("the store is gone", type="aborted")

    ctx = make_ctx(spawned=spawned)
    with pytest.raises(ToolError) as raised:
        BashTool().run({"command": "touch ran"}, ctx)
    assert raised.value.type == "aborted"
    assert not (location / "ran").exists()
    [pgid] = pgids
    assert not alive(pgid)


async def test_the_executor_records_the_group_through_its_hook_before_the_command_runs(
    runner: ToolActors, bounding: OutputBounding, location: Path, make_ctx: Any
) -> None:
    seen: list[tuple[str, ProcessGroup, bool]] = []

    async def record(ctx: ToolContext, group: ProcessGroup) -> None:
        # On the loop, while the tool's thread waits at the gate.
        await asyncio.sleep(0)
        seen.append((ctx.call_id, group, (location / "ran").exists()))

    executor = ToolExecutor(ToolRegistry(builtin_tools()), runner, bounding, record=record)
    outcome = await executor.execute("bash", {"command": "touch ran"}, make_ctx())
    assert outcome.status == "success"
    [(call_id, group, ran)] = seen
    assert (call_id, ran) == ("call_1", False)
    assert group.pgid > 0


async def test_a_failing_record_hook_fails_the_call_unrun(
    runner: ToolActors, bounding: OutputBounding, location: Path, make_ctx: Any
) -> None:
    async def record(ctx: ToolContext, group: ProcessGroup) -> None:
        raise ToolError("Tool execution aborted: session deleted", type="aborted")

    executor = ToolExecutor(ToolRegistry(builtin_tools()), runner, bounding, record=record)
    outcome = await executor.execute("bash", {"command": "touch ran"}, make_ctx())
    assert outcome.error is not None
    assert outcome.error["type"] == "aborted"
    assert not (location / "ran").exists()
