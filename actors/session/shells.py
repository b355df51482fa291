"""User shell commands (``session.shell``) and the session environment.

A shell starts at once as background work owned by :class:`Shells` (the
host), not by the request that asked for it: the caller gets its 204 when
``session.shell.started`` is durable, a client that disconnects cancels
nothing, and closing the host (:meth:`Shells.aclose`) kills every running
command's process group. It never waits for the session's execution or for
another shell, and it wakes nothing. It ends, its group killed, when its
session is interrupted (state ``cancelled``, reason ``interrupted``), when
``DELETE …/shell/{shellID}`` names it (``cancelled``/``cancelled``), after
``[runtime] shell_timeout_s`` (``failed``/``timeout``), and when its session
is deleted.

On completion (or a failure to start) one command records
``session.shell.ended {shell, output}`` and admits the notice as synthetic
input (steer, ``resume: false``): the agent sees it at its next step without
being woken. Both in one transaction, under the inbox lock, with a notice id
derived from the shell id: a notice is never lost between the two and never
admitted twice. A shell still ``running`` at the next start (a crash or a
shutdown killed it) is ended as ``cancelled`` the same way by
:meth:`Shells.recover` ("Command cancelled because the server restarted").

A command runs in its own process group behind a gate (as the bash tool's
do): ``session.shell.spawned`` names the group durably before the command may
run, so after a crash :meth:`Shells.recover` kills what is still running
(the same group: same leader start time, same boot) before it records the
cancellation. No shell outlives the host that started it by more than a
restart.

Output is bounded like the bash tool's while it streams
(:class:`~actors.tools._spill.SpillingOutput`): up to ``output_memory_bytes``
(8 MiB) is kept whole; past that the complete output goes to a managed file
in the tool-output directory as it arrives and memory keeps only its head
and tail. Then it is bounded like tool output
(:class:`~actors.tools.OutputBounding`: a preview that points at the file).

:class:`Environments` holds each session's variables (``PUT …/environment``)
in memory only: they may be credentials, so they never enter the log, an
event or a line of output. Shell commands and the bash tool get the server's
environment without its secrets (:func:`~actors.tools.tool_environment`)
overlaid with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal

from actors.session.inbox import Owners, Writer
from actors.tools import OutputBounding, ToolResult, text_item, tool_environment
from actors.tools._process import GATE, GATE_OPEN, ProcessGroup, identify, kill_stale
from actors.tools._spill import SpillingOutput
from protocol import events as ev
from protocol import ids
from protocol.errors import (
    ConflictError,
    InvalidRequestError,
    MessageNotFoundError,
    SessionNotFoundError,
)
from protocol.shapes import Session, ShellInfo
from storage import Command, ProjectionConflict, Store
from storage.clock import SYSTEM, Clock

__all__ = ["CANCELLED_TEXT", "Environments", "Shells", "notice_id"]

CANCELLED_TEXT: Final = "Command cancelled because the server restarted"
#: A shell ends after this long unless ``[runtime] shell_timeout_s`` says otherwise.
DEFAULT_TIMEOUT_S: Final = 600.0
#: What the entry says after the output of a command ended before its end, by reason.
_ENDED_TEXT: Final = {
    "interrupted": "Command cancelled: the session was interrupted",
    "cancelled": "Command cancelled on request",
    "timeout": "Command timed out after {timeout:g} s",
}
#: Bytes of one command's output kept in memory; beyond them it spills to a managed file.
MAX_OUTPUT_BYTES: Final = 8 * 1024 * 1024
#: Sessions whose environment is kept; bytes of one session's variables.
MAX_ENVIRONMENTS: Final = 10_000
MAX_ENVIRONMENT_BYTES: Final = 1024 * 1024

Bound = Callable[[str], Awaitable[str]]
#: Why a shell ended before its command did (on its entry as ``reason``).
Reason = Literal["interrupted", "cancelled", "timeout"]
#: Runs a blocking callable off the loop (the runtime's bounded BlockingExecutor).
Blocking = Callable[..., Awaitable[Any]]
#: SIGTERM to SIGKILL for a group a crash left running: nobody reads its output.
STALE_KILL_GRACE_S: Final = 0.5


def notice_id(shell_id: str) -> str:
    """The stable id of a shell's completion notice."""
    return f"{shell_id}n"


def _now() -> int:
    return time.time_ns() // 1_000_000


class Environments:
    """The variables of each session, in memory (bounded: count and bytes)."""

    def __init__(self, secret_env: frozenset[str] = frozenset()) -> None:
        self._secret_env = secret_env
        self._vars: dict[str, dict[str, str]] = {}

    def replace(self, session_id: str, variables: Mapping[str, str]) -> None:
        size = 0
        for name, value in variables.items():
            if not isinstance(value, str):
                # The codec keeps a mapping's values as JSON: a number or a list
                # reaches here and would fail the process spawn later.
                raise InvalidRequestError(
                    f"the value of {name!r} must be a string", field=f"variables.{name}"
                )
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise InvalidRequestError(
                    f"invalid environment variable {name!r}", field="variables"
                )
            size += len(name.encode()) + len(value.encode())
        if size > MAX_ENVIRONMENT_BYTES:
            raise InvalidRequestError(
                f"the environment exceeds {MAX_ENVIRONMENT_BYTES} bytes", field="variables"
            )
        self._vars.pop(session_id, None)
        if variables:
            if len(self._vars) >= MAX_ENVIRONMENTS:
                # The oldest replaced environment goes first (dicts keep insertion order).
                del self._vars[next(iter(self._vars))]
            self._vars[session_id] = dict(variables)

    def variables(self, session_id: str) -> Mapping[str, str]:
        return self._vars.get(session_id, {})

    def forget(self, session_id: str) -> None:
        self._vars.pop(session_id, None)

    def for_process(self, session_id: str) -> dict[str, str]:
        """What a shell or bash process of the session gets."""
        return {**tool_environment(secret_env=self._secret_env), **self.variables(session_id)}


class _Run:
    """One running shell: its task and how (if) it was told to end early."""

    __slots__ = ("deadline", "reason", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        #: Set by :meth:`Shells.stop` (or the timeout) before the group is killed.
        self.reason: Reason | None = None
        #: The timeout around the command: :meth:`Shells.stop` moves it to now.
        self.deadline: asyncio.Timeout | None = None

    def stop(self, reason: Reason) -> None:
        if self.reason is None:
            self.reason = reason
        if self.deadline is not None and not self.deadline.expired():
            # Only while the command runs: once it exited, the deadline is gone.
            self.deadline.reschedule(asyncio.get_running_loop().time())


class Shells:
    """The user shells of every session, each owned here until its end is recorded.

    A shell ends by itself, at ``timeout_s``, when its session is interrupted
    (:meth:`stop`), when :meth:`cancel` names it, when its session is deleted
    (:meth:`stop` then the deletion), or at shutdown (:meth:`aclose`, its entry
    left running for :meth:`recover`). Ending one kills its process group.
    """

    def __init__(
        self,
        store: Store,
        owners: Owners,
        environments: Environments,
        bounding: OutputBounding,
        bound_on: Blocking,
        *,
        shell: str = "/bin/bash",
        output_memory_bytes: int = MAX_OUTPUT_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Clock = SYSTEM,
    ) -> None:
        if output_memory_bytes < 2:
            raise ValueError("output_memory_bytes must be at least 2")
        if timeout_s <= 0:
            raise ValueError("shell_timeout_s must be positive")
        self._store = store
        self._owners = owners
        self._env = environments
        self._bounding = bounding
        self._bound_on = bound_on
        self._shell = shell
        self._memory = output_memory_bytes
        self._timeout_s = timeout_s
        #: What ``timeout_s`` is measured on.
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        #: Session id -> shell id -> its run, while it runs.
        self._runs: dict[str, dict[str, _Run]] = {}
        self._closed = False

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def ended(self) -> None:
        """Return once every shell started so far has ended (its end and notice recorded),
        those started meanwhile included. Waiting ends nothing early."""
        while self._tasks:
            await asyncio.shield(asyncio.gather(*self._tasks, return_exceptions=True))

    async def start(self, session: Session, command: str, shell_id: str | None = None) -> str:
        """Record the start and launch the command; returns its shell id."""
        if self._closed:
            raise asyncio.CancelledError()
        if not command.strip():
            raise InvalidRequestError("command must not be empty", field="command")
        if shell_id is not None:
            ids.validate("msg", shell_id, field="id")
            existing = await self._store.queries.message(session.id, shell_id)
            if existing is not None and existing.type == "shell":
                return shell_id  # an exact retry: the first start stands
        sid = shell_id or ids.message_id()
        info = ShellInfo(id=sid, command=command, time_started=_now())
        started = ev.ShellStarted(session_id=session.id, shell=info)

        async def start(_: Writer) -> None:
            await self._store.append(Command.of(started))

        try:
            await self._owners.command(session.id, start)
        except ProjectionConflict as exc:
            if exc.reason == "session.missing":
                raise SessionNotFoundError(session.id) from None
            raise ConflictError(str(exc), resource="message") from None
        run = _Run()
        runs = self._runs.setdefault(session.id, {})
        runs[sid] = run
        task = asyncio.get_running_loop().create_task(
            self._run(session, info, run), name=f"shell-{sid}"
        )
        run.task = task
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if runs.get(sid) is run:
                del runs[sid]
                if not runs and self._runs.get(session.id) is runs:
                    del self._runs[session.id]

        task.add_done_callback(done)
        return sid

    async def stop(self, session_ids: Sequence[str], reason: Reason) -> int:
        """End every running shell of ``session_ids``; how many; returns once each is recorded."""
        runs = [r for sid in session_ids for r in self._runs.get(sid, {}).values()]
        for run in runs:
            run.stop(reason)
        await self._settled(runs)
        return len(runs)

    async def cancel(self, session_id: str, shell_id: str) -> None:
        """End shell ``shell_id`` of the session (``DELETE …/shell/{shellID}``).

        One that already ended stays as it ended; an id that is no shell of
        this session (another session's included) is MessageNotFoundError.
        """
        ids.validate("msg", shell_id, field="shellID")
        run = self._runs.get(session_id, {}).get(shell_id)
        if run is None:
            entry = await self._store.queries.message(session_id, shell_id)
            if entry is None or entry.type != "shell":
                raise MessageNotFoundError(session_id, shell_id)
            return
        run.stop("cancelled")
        await self._settled([run])

    async def _settled(self, runs: Sequence[_Run]) -> None:
        tasks = [r.task for r in runs if r.task is not None]
        if tasks:
            # Shielded: a caller that goes away does not cut the ends short.
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))

    async def aclose(self) -> None:
        """Kill every running command; their entries stay running for :meth:`recover`."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def recover(self) -> int:
        """End every shell a previous process left running as ``cancelled``."""
        count = 0
        stale = [
            r
            for r in await self._store.queries.running_shells()
            if not any(t.get_name() == f"shell-{r.shell.id}" for t in self._tasks)
        ]
        groups = [
            ProcessGroup(pgid=r.process[0], start_ticks=r.process[1], boot_id=r.process[2])
            for r in stale
            if r.process is not None
        ]
        if groups:
            # Killed before the cancellation is recorded: nothing runs on unseen.
            await self._bound_on(kill_stale, groups, STALE_KILL_GRACE_S)
        for r in stale:
            session_id, info = r.session_id, r.shell
            ended = ShellInfo(
                id=info.id,
                command=info.command,
                state="cancelled",
                time_started=info.time_started,
                time_ended=_now(),
                reason="restart",
            )
            if await self._end(session_id, ended, CANCELLED_TEXT):
                count += 1
        return count

    async def _run(self, session: Session, info: ShellInfo, run: _Run) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                self._shell,
                "-c",
                GATE,
                self._shell,
                info.command,
                cwd=session.location.directory,
                env=self._env.for_process(session.id),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            failed = ShellInfo(
                id=info.id,
                command=info.command,
                state="failed",
                time_started=info.time_started,
                time_ended=_now(),
            )
            await self._end(session.id, failed, f"Could not start the command: {exc.strerror}")
            return
        output = SpillingOutput(self._memory, self._bounding.output_dir)
        code: int | None = None
        try:
            try:
                async with self._clock.timeout(self._timeout_s) as deadline:
                    run.deadline = deadline
                    if run.reason is not None:  # stopped while it was being spawned
                        deadline.reschedule(asyncio.get_running_loop().time())
                    await self._open_gate(session.id, info.id, proc)
                    await self._read(proc, output)
                    code = await proc.wait()
                    # Exited: a stop from now on (its end is being recorded)
                    # has no deadline left to move.
                    run.deadline = None
            except TimeoutError:
                if run.reason is None:
                    run.reason = "timeout"
                _kill_group(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        except BaseException:
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
            raise
        finally:
            try:
                await asyncio.shield(self._bound_on(output.close))
            except Exception:
                output.close()  # the executor is gone (shutdown): close it here
        # The shell ended; what it left behind in its group goes with it.
        _kill_group(proc.pid)
        text = await self._bound(output)
        reason = run.reason if code is None else None
        if reason is not None:
            note = _ENDED_TEXT[reason].format(timeout=self._timeout_s)
            text = f"{text}\n{note}" if text else note
        ended = ShellInfo(
            id=info.id,
            command=info.command,
            state=(
                "completed"
                if code == 0
                else "cancelled"
                if reason in ("interrupted", "cancelled")
                else "failed"
            ),
            exit=code,
            time_started=info.time_started,
            time_ended=_now(),
            reason=reason,
        )
        await self._end(session.id, ended, text)

    async def _open_gate(
        self, session_id: str, shell_id: str, proc: asyncio.subprocess.Process
    ) -> None:
        """Record the (still gated) group durably, then let the command run."""
        assert proc.stdin is not None
        group = await self._bound_on(identify, proc.pid)
        if group is not None:  # None: no /proc to name it by (not Linux)
            spawned = ev.ShellSpawned(
                session_id=session_id,
                shell_id=shell_id,
                pgid=group.pgid,
                start_ticks=group.start_ticks,
                boot_id=group.boot_id,
            )

            async def spawn(_: Writer) -> None:
                await self._store.append(Command.of(spawned))

            await self._owners.command(session_id, spawn)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(GATE_OPEN)
            await proc.stdin.drain()
        proc.stdin.close()

    async def _read(self, proc: asyncio.subprocess.Process, output: SpillingOutput) -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(64 * 1024):
            if output.spilled or output.total + len(chunk) > self._memory:
                await self._bound_on(output.add, chunk)  # writes the managed file
            else:
                output.add(chunk)

    async def _bound(self, output: SpillingOutput) -> str:
        saved = output.saved()
        result = ToolResult(
            content=(text_item(output.text()),), saved=saved, saved_bytes=output.total
        )
        bounded = await self._bound_on(self._bounding.bound, result)
        return "".join(str(c.get("text", "")) for c in bounded.content if c.get("type") == "text")

    async def _end(self, session_id: str, info: ShellInfo, output: str) -> bool:
        """Record the end and admit the notice, atomically; False if already ended."""
        nid = notice_id(info.id)
        notice = ev.InboxEnqueued(
            session_id=session_id,
            inbox_id=nid,
            item=ev.EnqueuedItem(
                type="synthetic",
                delivery="steer",
                payload={
                    "text": (
                        f'<shell id="{info.id}" state="{info.state}"'
                        f' command="{html.escape(info.command)}">\n'
                        f"{output}\n</shell>"
                    ),
                    "description": "Shell command",
                    "metadata": {
                        "source": "shell",
                        "jobID": info.id,
                        "shellID": info.id,
                        "state": info.state,
                        **({} if info.exit is None else {"exit": info.exit}),
                    },
                    "resume": False,
                },
            ),
        )
        ended = ev.ShellEnded(session_id=session_id, shell=info, output=output)

        async def end(_: Writer) -> bool:
            try:
                await self._store.append(Command.of(ended, notice))
            except ProjectionConflict:
                # Already ended (a concurrent recovery), or the session is gone.
                return False
            return True

        done: bool = await self._owners.command(session_id, end)
        return done


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
