"""The tool calls of one step: durable before they run, run concurrently, all settled.

A step hands each complete call to :class:`ToolCalls`. The call is recorded
(``session.tool.called``) and awaited durable *before* the tool starts, so a
crash leaves a known call that recovery fails as stale instead of running it
twice. Calls then run concurrently as tasks this object owns, each tool in its
own pykka child actor adopted by this step's :class:`~actors.tools.ToolOwner`
(its Progress comes back here and is published live); their terminals
(``tool.success`` / ``tool.failed``) are published one at a time, in the
order the calls finish. :meth:`ToolCalls.join` collects every outcome and
:meth:`ToolCalls.cancel` settles every started call: either way no call
outlives the step that started it.

Settlement, exactly:

- A call stays on the books from the moment its input starts (or its
  ``tool.called`` is submitted) until its terminal is durable; it leaves the
  "unfinished" list only once ``tool.called`` is durable and its task exists,
  so an interrupt that lands while ``tool.called`` commits still leaves a call
  that :meth:`fail_unfinished` settles.
- :meth:`cancel` returns only when every call has a durable terminal, even a
  call whose task was cancelled before it ever ran (``executed: false``).
- An interrupt that arrives after the tool succeeded publishes that success
  (:class:`~actors.tools.SucceededThenInterrupted`), never ``aborted``: the
  model must not be told a write that happened did not.

A call whose input streamed but never completed is failed by
:meth:`ToolCalls.fail_unfinished` (``executed: false``); a tool the agent
may not use fails with ``permission.denied`` without running, and the step
goes on: the model sees the failure in the next step's history and can react.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Protocol

from actors._shield import finish
from actors.agents import Agent
from actors.bus import EventBus
from actors.llm import TOOLS_DISABLED_ERROR, ToolCall
from actors.tools import (
    Progress,
    SucceededThenInterrupted,
    ToolContext,
    ToolExecutor,
    ToolOutcome,
    ToolOwner,
    permission,
)
from protocol import events as ev
from protocol.shapes import Session

__all__ = ["Journal", "ToolCalls"]


class Journal(Protocol):
    """Where a step's events go: submitted in order, some awaited durable."""

    def emit(self, event: ev.Event) -> None: ...

    async def durable(self, event: ev.Event) -> None: ...


class ToolCalls:
    """Every tool call of one assistant message, from ``tool.called`` to its terminal."""

    def __init__(
        self,
        *,
        journal: Journal,
        session: Session,
        agent: Agent,
        assistant_id: str,
        bus: EventBus,
        executor: ToolExecutor,
        output_dir: Path,
        secret_env: frozenset[str],
        server_dirs: tuple[Path, ...],
    ) -> None:
        self._journal = journal
        self._session = session
        self._agent = agent
        self._assistant_id = assistant_id
        self._bus = bus
        self._executor = executor
        self._output_dir = output_dir
        self._secret_env = secret_env
        self._server_dirs = server_dirs
        #: Calls whose input started streaming but that were never completed (id -> name).
        self._unfinished: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[ToolOutcome]] = {}
        #: Calls whose ``tool.called`` is durable and whose terminal is not yet (id -> name).
        self._open: dict[str, str] = {}
        #: Calls whose task began to run (so the tool may have executed).
        self._ran: set[str] = set()
        self._terminals = asyncio.Lock()
        #: The step's child actors, one per running call; they report Progress here.
        self._owner = ToolOwner(on_progress=self._progress)

    def input_started(self, call_id: str, name: str) -> None:
        self._unfinished[call_id] = name

    async def called(self, call: ToolCall, *, limited: bool) -> None:
        """Record ``call`` durably, then start it (or its refusal)."""
        # On the books before anything is submitted: an interrupt while
        # tool.called commits must still leave a call to settle.
        self._unfinished.setdefault(call.id, call.name)
        # Durable before any side effect: after a crash the call is known, and
        # is failed as stale rather than silently run twice.
        await self._journal.durable(
            ev.ToolCalled(
                session_id=self._session.id,
                assistant_message_id=self._assistant_id,
                id=call.id,
                name=call.name,
                input=dict(call.input),
            )
        )
        agent = self._agent
        refusal: ToolOutcome | None = None
        if limited:
            refusal = ToolOutcome.failure("tool.disabled", TOOLS_DISABLED_ERROR)
        elif permission(agent.permissions, call.name) == "deny":
            refusal = ToolOutcome.failure(
                "permission.denied",
                f"Permission denied: agent {agent.name} may not use the {call.name} tool",
            )
        loop = asyncio.get_running_loop()
        self._open[call.id] = call.name
        self._tasks[call.id] = loop.create_task(self._settle(call, refusal), name=f"tool:{call.id}")
        del self._unfinished[call.id]  # from here on its task owns its terminal

    async def join(self) -> list[ToolOutcome]:
        """Every started call's outcome, in the order the calls were made."""
        return [await task for task in self._tasks.values()]

    @property
    def owner(self) -> ToolOwner:
        """The step's books of its child actors (one per running local call)."""
        return self._owner

    async def cancel(self) -> None:
        """Stop the running calls and wait until each has a durable terminal.

        Stopping the owner stops its children: each is cancelled, and this
        returns only after every child has reported and every call settled.
        """
        for task in self._tasks.values():
            task.cancel()
        await self._owner.stop()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # A task cancelled before its first step never ran its coroutine, so it
        # published nothing: its call still gets its one terminal here.
        for call_id, name in list(self._open.items()):
            never_ran = ToolOutcome.failure("aborted", f"Tool execution interrupted: {name}")
            await finish(self._terminal(call_id, never_ran, executed=call_id in self._ran))

    def fail_unfinished(self, message: str) -> None:
        """Every call the step started reaches a terminal, even one never completed."""
        for call_id, name in self._unfinished.items():
            self._journal.emit(
                ev.ToolFailed(
                    session_id=self._session.id,
                    assistant_message_id=self._assistant_id,
                    id=call_id,
                    error=ev.ErrorInfo(type="aborted", message=f"{message}: {name}"),
                    executed=False,
                )
            )
        self._unfinished.clear()

    async def _settle(self, call: ToolCall, refusal: ToolOutcome | None) -> ToolOutcome:
        self._ran.add(call.id)
        if refusal is not None:
            outcome = refusal
        else:
            session = self._session
            ctx = ToolContext(
                session_id=session.id,
                call_id=call.id,
                assistant_message_id=self._assistant_id,
                directory=Path(session.location.directory),
                output_dir=self._output_dir,
                cancel=threading.Event(),
                config_writes=permission(self._agent.permissions, "config") == "allow",
                secret_env=self._secret_env,
                server_dirs=self._server_dirs,
            )
            try:
                outcome = await self._executor.execute(
                    call.name, call.input, ctx, owner=self._owner
                )
            except SucceededThenInterrupted as late:
                # The tool's operation happened: its success is the settlement.
                await finish(self._terminal(call.id, late.outcome))
                raise
            except asyncio.CancelledError:
                interrupted = ToolOutcome.failure(
                    "aborted", f"Tool execution interrupted: {call.name}"
                )
                await finish(self._terminal(call.id, interrupted))
                raise
        await finish(self._terminal(call.id, outcome))
        return outcome

    async def _terminal(self, call_id: str, outcome: ToolOutcome, *, executed: bool = True) -> None:
        event: ev.Event
        if outcome.status == "success":
            event = ev.ToolSucceeded(
                session_id=self._session.id,
                assistant_message_id=self._assistant_id,
                id=call_id,
                content=tuple(outcome.content),
                metadata=dict(outcome.metadata) or None,
            )
        else:
            error = outcome.error or {}
            event = ev.ToolFailed(
                session_id=self._session.id,
                assistant_message_id=self._assistant_id,
                id=call_id,
                error=ev.ErrorInfo(
                    type=str(error.get("type", "tool.error")),
                    message=str(error.get("message", "")),
                ),
                content=tuple(outcome.content) or None,
                metadata=dict(outcome.metadata) or None,
                executed=executed,
            )
        # One terminal at a time, in the order the calls finish.
        async with self._terminals:
            if call_id not in self._open:
                return  # already settled: a call has exactly one terminal
            await self._journal.durable(event)
            del self._open[call_id]

    def _progress(self, message: Progress) -> None:
        """A child's Progress (on the loop): published live, never stored."""
        self._bus.live(
            ev.ToolProgress(
                session_id=self._session.id,
                assistant_message_id=self._assistant_id,
                id=message.call_id,
                metadata=dict(message.metadata),
            )
        )
