"""The bash tool: one ``/bin/bash -c`` command in the session's Location.

The command runs in a new session (``start_new_session=True``), so it and
everything it starts share one process group that we can signal as a whole.
The worker thread multiplexes three things without any helper thread: the
merged stdout/stderr pipe and ``ctx.cancel`` (both in one ``selectors``
selector: the cancel wakes it at once), and the deadline.

- The command starts behind a gate: the shell first waits for a line on a
  pipe of ours, and only then execs ``bash -c <command>`` (same pid, same
  process group, same start time). Meanwhile ``ctx.spawned`` records the group
  (id, leader start time, boot id) durably. If that fails, or the server dies
  first, the gate closes without the line and the shell exits without running
  anything: a command never runs unrecorded, so the next start can always
  find and kill what a crash left behind.
- Output is streamed to ``ctx.progress({"output": <tail>})`` at most every
  ``progress_interval_s`` (100 ms), only when something new arrived.
- The call returns when bash exits. Output still buffered in the pipe is read
  for a short moment afterwards; a background job that keeps the pipe open
  does not hold the call (it is left running, as in a shell).
- Output is bounded while it streams: up to ``output_memory_bytes`` (1 MiB)
  is kept whole; past that the complete output is written to a managed
  tool-output file as it arrives and memory keeps only its first and last
  half-megabyte. The result then carries that file (``ToolResult.saved``), and
  bounding cuts the preview from the head and tail and points at the file,
  without saving anything twice.
- Timeout: the call's ``timeout_s``, or the default (``[runtime]
  bash_timeout_s``, 120 s), at most the cap (``[runtime] bash_max_timeout_s``,
  600 s; a larger ask is clamped). When it passes, the group is killed and the
  call fails with type ``timeout`` and a message that says so (OpenCode's bash
  says "bash tool terminated command after exceeding timeout <ms> ms").
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
import subprocess
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

from actors.tools._environment import tool_environment
from actors.tools._process import GATE, GATE_OPEN, identify, kill_group
from actors.tools._spill import SpillingOutput
from actors.tools._types import ToolContext, ToolError, ToolResult, text_item

__all__ = ["DEFAULT_MAX_TIMEOUT_S", "DEFAULT_OUTPUT_MEMORY_BYTES", "BashTool"]

#: The longest a call may ask for (``[runtime] bash_max_timeout_s``).
DEFAULT_MAX_TIMEOUT_S: Final = 600.0
#: Output kept in memory per call while it streams (``[runtime] bash_output_memory_bytes``).
DEFAULT_OUTPUT_MEMORY_BYTES: Final = 1024 * 1024

_CHUNK: Final = 65_536
_POLL_S: Final = 0.05
#: How long output still in the pipe is read after bash has exited.
_DRAIN_S: Final = 0.1
_PROGRESS_TAIL: Final = 4_096
_ERROR_TAIL: Final = 16_384

Stop = Literal["aborted", "timeout"]


class BashTool:
    name = "bash"
    description = (
        "Run a bash command in the session's directory (stdout and stderr merged)."
        " A non-zero exit code is reported in the output. The command and"
        " everything it started are killed after timeout_s seconds (default 120,"
        " at most the configured cap, 600 unless configured otherwise)."
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
        kill_grace_s: float = 0.5,
        progress_interval_s: float = 0.1,
        output_memory_bytes: int = DEFAULT_OUTPUT_MEMORY_BYTES,
        default_timeout_s: float | None = None,
        max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S,
    ) -> None:
        if output_memory_bytes < 2:
            raise ValueError("output_memory_bytes must be at least 2")
        if max_timeout_s <= 0 or (default_timeout_s is not None and default_timeout_s <= 0):
            raise ValueError("bash timeouts must be positive")
        self._shell = shell
        self._grace = kill_grace_s
        self._interval = progress_interval_s
        self._memory = output_memory_bytes
        #: None: the context's ``timeout_s`` (120 s unless a caller set another).
        self._default_timeout = default_timeout_s
        self._max_timeout = max_timeout_s

    def timeout_for(self, input: Mapping[str, Any], ctx: ToolContext) -> float:
        """The call's timeout: its own ``timeout_s`` or the default, at most the cap."""
        default = ctx.timeout_s if self._default_timeout is None else self._default_timeout
        asked = input.get("timeout_s")
        return min(float(default if asked is None else asked), self._max_timeout)

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        timeout = self.timeout_for(input, ctx)
        deadline = time.monotonic() + timeout
        try:
            proc = subprocess.Popen(
                [self._shell, "-c", GATE, self._shell, input["command"]],
                cwd=ctx.directory,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**tool_environment(secret_env=ctx.secret_env), **ctx.environment},
            )
        except OSError as exc:
            raise ToolError(f"Could not start {self._shell}: {exc}") from exc
        assert proc.stdin is not None
        gate = proc.stdin.fileno()
        output = SpillingOutput(self._memory, ctx.output_dir)
        stop: Stop | None = None
        finished = False
        try:
            try:
                self._record(proc, ctx)
                if ctx.cancel.is_set():
                    stop = "aborted"
                else:
                    # EPIPE: the shell is gone already; _pump reports how it ended.
                    with contextlib.suppress(BrokenPipeError):
                        os.write(gate, GATE_OPEN)  # exit 125 (gate closed) only follows a failure
            finally:
                proc.stdin.close()
            if stop is None:
                stop = self._pump(proc, ctx, output, deadline)
                finished = stop is None
        finally:
            if not finished:
                kill_group(proc.pid, self._grace, reap=proc.poll)
                _reap(proc)
            assert proc.stdout is not None
            proc.stdout.close()
            output.close()
        if stop == "timeout":
            raise ToolError(
                f"Command timed out after {timeout:g} s: the bash tool terminated it after"
                f" exceeding its timeout ({timeout * 1000:.0f} ms) and killed its process"
                f" group.{_partial(output)}",
                type="timeout",
            )
        if stop is not None:
            raise ToolError(f"Command aborted and was killed.{_partial(output)}", type=stop)
        code = proc.returncode
        text = output.text()
        if code != 0:
            status = f"Exit code: {code}" if code > 0 else f"Terminated by signal {-code}"
            text += ("\n" if text and not text.endswith("\n") else "") + status
        saved = output.saved()
        return ToolResult(
            content=(text_item(text or "(no output)"),),
            metadata={"exitCode": code},
            saved=saved,
            saved_bytes=output.total,
        )

    @staticmethod
    def _record(proc: subprocess.Popen[bytes], ctx: ToolContext) -> None:
        """Durably record the (still gated) group; raises ToolError when that fails."""
        group = identify(proc.pid)
        if group is None:
            # No /proc to name it by (not Linux): nothing a later start could check.
            return
        ctx.spawned(group)

    def _pump(
        self,
        proc: subprocess.Popen[bytes],
        ctx: ToolContext,
        output: SpillingOutput,
        deadline: float,
    ) -> Stop | None:
        """Read output until bash exits (``None``), or the call must stop."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        last_progress = float("-inf")
        fresh = eof = False
        with selectors.DefaultSelector() as selector, ctx.cancel.readable() as cancelled:
            selector.register(fd, selectors.EVENT_READ)
            # Readable the moment the call's actor hears Cancel: no wait for a poll.
            selector.register(cancelled, selectors.EVENT_READ)
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
                ready = {key.fd for key, _ in selector.select(min(_POLL_S, remaining))}
                if fd in ready:
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


def _drain(selector: selectors.BaseSelector, fd: int, output: SpillingOutput) -> None:
    """Read what is already in the pipe, briefly: a background job may hold it open."""
    end = time.monotonic() + _DRAIN_S
    while time.monotonic() < end and any(key.fd == fd for key, _ in selector.select(0)):
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return
        output.add(chunk)


def _partial(output: SpillingOutput) -> str:
    tail = output.tail(_ERROR_TAIL)
    if not tail:
        return " It produced no output."
    saved = output.saved()
    where = f" The full output so far is saved to {saved}." if saved is not None else ""
    return f"{where} Output so far (last {_ERROR_TAIL} bytes at most):\n{tail}"


def _reap(proc: subprocess.Popen[bytes]) -> None:
    # TimeoutExpired: stuck in the kernel (D state); nothing more a signal can do.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
