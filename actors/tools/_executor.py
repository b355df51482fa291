"""ToolExecutor: one tool call from input to settled outcome, off the event loop.

``execute`` never raises for anything the model or the tool did wrong; every
such case is a failed :class:`ToolOutcome`:

- unknown tool name → ``unknown-tool``;
- input that breaks the tool's JSON Schema → ``invalid-input`` (the tool does
  not run);
- ``ctx.cancel`` already set → ``aborted`` (the tool does not run);
- :class:`ToolError` from the tool → its ``type`` and message;
- any other exception → ``tool.error`` with the exception text;
- the runner closed → ``aborted``.

The tool's ``run`` and the bounding of its successful result happen in *one*
job on the :class:`~actors.BlockingRunner` (one thread, one slot): bounding
may write a managed output file, and a success is never handed back unbounded.

Process records
---------------
A tool that starts a process group calls ``ctx.spawned(group)`` from its
thread before the group may run anything. With a ``record`` hook, the
executor answers it: the hook runs on the loop (it appends
``session.tool.spawned``) while the thread waits for it, and a hook that
fails, or does not finish within ``record_timeout_s``, makes ``spawned``
raise :class:`ToolError` so the tool kills the group unrun.

Cancellation
------------
``ctx.cancel`` is the cooperative stop signal; it is passed to the runner as
the job's cancel event. Two ways to stop a call:

- Somebody sets ``ctx.cancel`` (the task keeps awaiting): the tool notices,
  raises ``ToolError(type="aborted")``, and ``execute`` *returns* that failed
  outcome.
- The task awaiting ``execute`` is cancelled (an interrupt): the runner sets
  ``ctx.cancel``, waits until the job has returned (the tool has stopped its
  subprocess, bounding has finished writing if the tool had already
  succeeded), and then the cancellation **propagates** out of ``execute``.
  ``execute`` never swallows a cancellation. What it carries depends on how
  the job ended:

  - the tool succeeded (the interrupt came too late to stop it, or the tool
    finished its work regardless): :class:`SucceededThenInterrupted`, whose
    ``outcome`` is the bounded success. Once a tool operation has succeeded,
    bounding it and handing it back is one interruption-safe region: the
    caller publishes that success, never ``aborted`` for work that happened;
  - otherwise a plain ``CancelledError``: no outcome, the caller publishes the
    failed terminal itself (``{"type": "aborted"}``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs

from actors._exceptions import ActorDeadError
from actors._threaded import BlockingRunner
from actors.tools._bounding import OutputBounding
from actors.tools._process import ProcessGroup
from actors.tools._registry import ToolRegistry
from actors.tools._types import (
    SucceededThenInterrupted,
    Tool,
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolResult,
)

__all__ = ["RecordProcess", "ToolExecutor"]

logger = logging.getLogger(__name__)

#: Makes a call's process group durable (on the loop); raises when it cannot.
RecordProcess = Callable[[ToolContext, ProcessGroup], Awaitable[None]]

#: A guard, not a deadline: a commit takes milliseconds.
RECORD_TIMEOUT_S: Final = 30.0


class ToolExecutor:
    """Validates, runs on a worker thread, and bounds tool calls."""

    def __init__(
        self,
        registry: ToolRegistry,
        runner: BlockingRunner,
        bounding: OutputBounding,
        *,
        record: RecordProcess | None = None,
        record_timeout_s: float = RECORD_TIMEOUT_S,
    ) -> None:
        self._registry = registry
        self._runner = runner
        self._bounding = bounding
        self._record = record
        self._record_timeout = record_timeout_s

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def bounding(self) -> OutputBounding:
        return self._bounding

    async def execute(self, name: str, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
        """Run tool ``name`` with ``input`` and return its settled outcome.

        Raises:
            SucceededThenInterrupted: the awaiting task was cancelled but the
                tool had succeeded anyway; ``outcome`` is its bounded success.
            asyncio.CancelledError: the awaiting task was cancelled; the tool has
                been asked to stop (``ctx.cancel``) and has returned.
        """
        try:
            tool = self._registry.lookup(name)
            problem = self._registry.validate(name, input)
        except ToolError as exc:
            return ToolOutcome.from_error(exc)
        if problem is not None:
            return ToolOutcome.failure("invalid-input", problem)
        if ctx.cancel.is_set():
            return ToolOutcome.failure("aborted", f"Tool execution aborted: {name}")
        if self._record is not None:
            ctx = attrs.evolve(ctx, spawned=self._spawned(self._record, ctx))
        # The job leaves its settled outcome here too: a cancellation makes the
        # runner drop the job's return value, but not a success that happened.
        settled: list[ToolOutcome] = []
        try:
            return await self._runner.run(
                self._settle, tool, input, ctx, settled, cancel=ctx.cancel
            )
        except asyncio.CancelledError:
            if settled and settled[0].status == "success":
                raise SucceededThenInterrupted(settled[0]) from None
            raise
        except ActorDeadError as exc:
            return ToolOutcome.failure("aborted", f"Tool execution aborted: {name} ({exc})")
        except Exception as exc:
            # Only the runner itself can get here (the job converts its own errors).
            return ToolOutcome.failure("tool.error", _describe(exc))

    def _spawned(self, record: RecordProcess, ctx: ToolContext) -> Callable[[ProcessGroup], None]:
        loop = asyncio.get_running_loop()
        timeout = self._record_timeout

        def spawned(group: ProcessGroup) -> None:  # called on the tool's thread
            try:
                future = asyncio.run_coroutine_threadsafe(_awaited(record(ctx, group)), loop)
            except RuntimeError:  # the loop is closed: nobody could record it
                raise ToolError(
                    "Tool execution aborted: the runtime stopped", type="aborted"
                ) from None
            try:
                future.result(timeout)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise ToolError(
                    f"Could not record the command's process within {timeout:g} s"
                ) from None
            except ToolError:
                raise
            except Exception as exc:
                raise ToolError(f"Could not record the command's process: {exc}") from exc

        return spawned

    def _settle(
        self, tool: Tool, input: Mapping[str, Any], ctx: ToolContext, settled: list[ToolOutcome]
    ) -> ToolOutcome:
        """Worker-thread side: run the tool, then bound a success (also left in ``settled``).

        ``settled`` is read on the loop only after the runner has seen this job
        return (its result hop happens after the append), so no lock is needed.
        """
        outcome = self._outcome(tool, input, ctx)
        settled.append(outcome)
        return outcome

    def _outcome(self, tool: Tool, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
        try:
            result: object = tool.run(input, ctx)
            if not isinstance(result, ToolResult):
                raise TypeError(f"tool {tool.name!r} returned {type(result).__name__}")
        except ToolError as exc:
            return ToolOutcome.from_error(exc)
        except Exception as exc:
            logger.warning("tool %r raised unexpectedly", tool.name, exc_info=True)
            return ToolOutcome.failure("tool.error", _describe(exc))
        # No cancel check from here on: once the tool has succeeded, bounding it and
        # handing it back is one region; a late interrupt cannot undo the success.
        try:
            bounded = self._bounding.bound(result)
        except Exception as exc:
            logger.warning("bounding the output of %r failed", tool.name, exc_info=True)
            return ToolOutcome.failure("tool.error", f"bounding tool output failed: {exc}")
        return ToolOutcome.success(bounded)


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
