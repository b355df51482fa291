"""The bash tool: one ``/bin/bash -c`` command in the session's Location.

The command runs in a new session (``start_new_session=True``), so it and
everything it starts share one process group that we can signal as a whole.
The worker thread multiplexes three things without any helper thread: the
merged stdout/stderr pipe (``selectors``), ``ctx.cancel``, and the deadline.

- Output is streamed to ``ctx.progress({"output": <tail>})`` at most every
  ``progress_interval_s`` (100 ms), only when something new arrived.
- The call returns when bash exits. Output still buffered in the pipe is read
  for a short moment afterwards; a background job that keeps the pipe open
  does not hold the call (it is left running, as in a shell).
- A non-zero exit is a *successful* call, like a shell: the text ends with the
  exit code, and ``metadata["exitCode"]`` has it.
- On ``ctx.cancel`` or timeout the whole process group gets SIGTERM, then
  SIGKILL after ``kill_grace_s`` if anything in it still lives; the call
  returns only once the group has no live member, and raises
  ``ToolError(type="aborted" | "timeout")`` with the tail of the output so far.
  Any other way out of ``run`` (an exception in ``ctx.progress``) also kills
  the group first: nothing we started outlives the call unasked.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from actors.tools._environment import tool_environment
from actors.tools._types import ToolContext, ToolError, ToolResult

__all__ = ["BashTool"]

_CHUNK: Final = 65_536
_POLL_S: Final = 0.05
#: How long output still in the pipe is read after bash has exited.
_DRAIN_S: Final = 0.1
_PROGRESS_TAIL: Final = 4_096
_ERROR_TAIL: Final = 16_384
_PROC: Final = Path("/proc")

Stop = Literal["aborted", "timeout"]


class _Output:
    """The command's output, kept up to a cap (the rest is counted, not stored)."""

    def __init__(self, cap: int) -> None:
        self._data = bytearray()
        self._cap = cap
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self._cap - len(self._data)
        self._data += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    def tail(self, size: int) -> str:
        return self._data[-size:].decode("utf-8", "replace")

    def text(self) -> str:
        text = self._data.decode("utf-8", "replace")
        if self.dropped:
            text += f"\n(… {self.dropped} more bytes of output were discarded)"
        return text


class BashTool:
    name = "bash"
    description = (
        "Run a bash command in the session's directory (stdout and stderr merged)."
        " A non-zero exit code is reported in the output. The command is killed"
        " after timeout_s seconds (default 120)."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86_400},
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def __init__(
        self,
        *,
        shell: str = "/bin/bash",
        kill_grace_s: float = 2.0,
        progress_interval_s: float = 0.1,
        max_output_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self._shell = shell
        self._grace = kill_grace_s
        self._interval = progress_interval_s
        self._cap = max_output_bytes

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        timeout = float(input.get("timeout_s", ctx.timeout_s))
        deadline = time.monotonic() + timeout
        try:
            proc = subprocess.Popen(
                [self._shell, "-c", input["command"]],
                cwd=ctx.directory,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=tool_environment(secret_env=ctx.secret_env),
            )
        except OSError as exc:
            raise ToolError(f"Could not start {self._shell}: {exc}") from exc
        output = _Output(self._cap)
        stop: Stop | None = None
        finished = False
        try:
            stop = self._pump(proc, ctx, output, deadline)
            finished = stop is None
        finally:
            if not finished:
                _kill_group(proc, self._grace)
            assert proc.stdout is not None
            proc.stdout.close()
        if stop is not None:
            what = "aborted" if stop == "aborted" else f"timed out after {timeout:g} s"
            raise ToolError(f"Command {what} and was killed.{_partial(output)}", type=stop)
        code = proc.returncode
        text = output.text()
        if code != 0:
            status = f"Exit code: {code}" if code > 0 else f"Terminated by signal {-code}"
            text += ("\n" if text and not text.endswith("\n") else "") + status
        return ToolResult.text(text or "(no output)", exitCode=code)

    def _pump(
        self, proc: subprocess.Popen[bytes], ctx: ToolContext, output: _Output, deadline: float
    ) -> Stop | None:
        """Read output until bash exits (``None``), or the call must stop."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        last_progress = float("-inf")
        fresh = eof = False
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                if ctx.cancel.is_set():
                    return "aborted"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                if proc.poll() is not None:
                    if not eof:
                        _drain(selector, fd, output)
                    return None
                if eof:
                    # Everything closed its stdout but bash runs on: wait, still cancellable.
                    ctx.cancel.wait(min(_POLL_S, remaining))
                    continue
                if selector.select(min(_POLL_S, remaining)):
                    chunk = os.read(fd, _CHUNK)
                    if chunk:
                        output.add(chunk)
                        fresh = True
                    else:
                        eof = True
                now = time.monotonic()
                if fresh and now - last_progress >= self._interval:
                    ctx.progress({"output": output.tail(_PROGRESS_TAIL)})
                    last_progress = now
                    fresh = False


def _drain(selector: selectors.BaseSelector, fd: int, output: _Output) -> None:
    """Read what is already in the pipe, briefly: a background job may hold it open."""
    end = time.monotonic() + _DRAIN_S
    while time.monotonic() < end and selector.select(0):
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return
        output.add(chunk)


def _partial(output: _Output) -> str:
    tail = output.tail(_ERROR_TAIL)
    if not tail:
        return " It produced no output."
    return f" Output so far (last {_ERROR_TAIL} bytes at most):\n{tail}"


def _signal_group(pgid: int, signum: int) -> None:
    # Gone already, or a member we may not signal: both leave nothing for us to do.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies do not count).

    ``killpg(pgid, 0)`` alone would say yes while a killed member waits as a
    zombie for a parent (or an init) that never reaps it, so on Linux the
    group's members are looked up in /proc.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not _PROC.is_dir():
        return True
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _wait_group_gone(proc: subprocess.Popen[bytes], pgid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while True:
        proc.poll()  # reap bash itself, so it does not linger in the group as a zombie
        if not _group_alive(pgid):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def _kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the command's process group, SIGKILL what is left after ``grace``."""
    pgid = proc.pid  # start_new_session: bash leads its own group
    _signal_group(pgid, signal.SIGTERM)
    if not _wait_group_gone(proc, pgid, grace):
        _signal_group(pgid, signal.SIGKILL)
        _wait_group_gone(proc, pgid, 5.0)
    # TimeoutExpired: stuck in the kernel (D state); nothing more a signal can do.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
