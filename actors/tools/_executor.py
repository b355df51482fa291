"""ToolExecutor: one tool call from input to settled outcome, off the event loop.

``execute`` never raises for anything the model or the tool did wrong; every
such case is a failed :class:`ToolOutcome`:

- unknown tool name → ``unknown-tool``;
- input that breaks the tool's JSON Schema → ``invalid-input`` (the tool does
  not run);
- ``ctx.cancel`` already set → ``aborted`` (the tool does not run);
- :class:`ToolError` from the tool → its ``type`` and message;
- any other exception → ``tool.error`` with the exception text;
- the actor pool closed → ``aborted``.

An async tool (``is_async``: :class:`~actors.tools.AsyncTool`) runs as a task
on the loop instead, holding no thread while it waits (a subagent's ``task``
call waits for a whole child session); only the bounding of its success
takes a child actor.

Each call runs in its own child actor (:mod:`actors.tools._actors`), adopted
by the ``owner`` the caller passes (the step's :class:`~actors.tools.ToolOwner`).
The tool's ``run`` and the bounding of its successful result happen in that
one actor's Run (one thread, one slot): bounding may write a managed output
file, and a success is never handed back unbounded. An exception that
escapes the tool (anything but :class:`ToolError`) is the actor's failure:
its ``on_failure`` settles the call as ``tool.error``. A child's progress
reaches the owner as ``Progress`` messages.

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
``ctx.cancel`` is the cooperative stop signal; the child actor's Cancel sets it.
Two ways to stop a call:

- Somebody sets ``ctx.cancel`` (the task keeps awaiting): the tool notices,
  raises ``ToolError(type="aborted")``, and ``execute`` *returns* that failed
  outcome.
- The task awaiting ``execute`` is cancelled (an interrupt): the child is
  cancelled (``ctx.cancel``), the call waits until the child has reported
  (the tool has stopped its subprocess, bounding has finished writing if the
  tool had already succeeded), and then the cancellation **propagates** out
  of ``execute``.
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
from pathlib import Path
from typing import Any, Final, cast

import attrs

from actors.kit import ActorDeadError, finish, wait_out
from actors.tools._actors import ToolActors, ToolOwner
from actors.tools._bounding import OutputBounding
from actors.tools._process import ProcessGroup
from actors.tools._registry import ToolRegistry
from actors.tools._types import (
    AsyncTool,
    CancelEvent,
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

#: More tools a call may name, by the session's Location (an MCP server's:
#: ``actors.mcp.McpServers.registry``); the runtime's registry is asked first.
MoreTools = Callable[[Path], ToolRegistry | None]

#: A guard, not a deadline: a commit takes milliseconds.
RECORD_TIMEOUT_S: Final = 30.0


class ToolExecutor:
    """Validates, runs on a worker thread, and bounds tool calls."""

    def __init__(
        self,
        registry: ToolRegistry,
        actors: ToolActors,
        bounding: OutputBounding,
        *,
        record: RecordProcess | None = None,
        record_timeout_s: float = RECORD_TIMEOUT_S,
        more: MoreTools | None = None,
    ) -> None:
        self._registry = registry
        self._more = more
        self._actors = actors
        self._bounding = bounding
        self._record = record
        self._record_timeout = record_timeout_s

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def bounding(self) -> OutputBounding:
        return self._bounding

    @property
    def actors(self) -> ToolActors:
        return self._actors

    async def execute(
        self,
        name: str,
        input: Mapping[str, Any],
        ctx: ToolContext,
        *,
        owner: ToolOwner | None = None,
    ) -> ToolOutcome:
        """Run tool ``name`` with ``input`` in a child actor of ``owner``; its settled outcome.

        With an ``owner``, the tool's ``ctx.progress`` reports go to it as
        ``Progress`` messages (instead of ``ctx.progress``).

        Raises:
            SucceededThenInterrupted: the awaiting task was cancelled but the
                tool had succeeded anyway; ``outcome`` is its bounded success.
            asyncio.CancelledError: the awaiting task was cancelled; the tool has
                been asked to stop (``ctx.cancel``) and its actor has reported.
        """
        registry = self._registry_of(name, ctx)
        try:
            tool = registry.lookup(name)
            problem = registry.validate(name, input)
        except ToolError as exc:
            return ToolOutcome.from_error(exc)
        if problem is not None:
            return ToolOutcome.failure("invalid-input", problem)
        if ctx.cancel.is_set():
            return ToolOutcome.failure("aborted", f"Tool execution aborted: {name}")
        if self._record is not None:
            ctx = attrs.evolve(ctx, spawned=self._spawned(self._record, ctx))
        if owner is not None:
            ctx = attrs.evolve(ctx, progress=owner.reporter(ctx.call_id))
        if getattr(tool, "is_async", False):
            return await self._run_async(cast(AsyncTool, tool), input, ctx)
        call = ctx

        def work() -> ToolOutcome:
            return self._outcome(tool, input, call)

        try:
            return await self._actors.run(work, call_id=ctx.call_id, cancel=ctx.cancel, owner=owner)
        except ActorDeadError as exc:
            return ToolOutcome.failure("aborted", f"Tool execution aborted: {name} ({exc})")

    def _registry_of(self, name: str, ctx: ToolContext) -> ToolRegistry:
        if name in self._registry or self._more is None:
            return self._registry
        return self._more(ctx.directory) or self._registry

    async def _run_async(
        self, tool: AsyncTool, input: Mapping[str, Any], ctx: ToolContext
    ) -> ToolOutcome:
        """An async tool: its coroutine as a task on the loop, owned by this call.

        Cancelled with the awaiting task (``ctx.cancel`` set too), and waited
        for before the cancellation propagates; a success is bounded in a
        child actor (bounding may write a managed file), as a thread tool's is.
        """
        work = asyncio.get_running_loop().create_task(
            _arun(tool, input, ctx), name=f"tool:{ctx.call_id}"
        )
        try:
            # wait(), not await: cancelling us must not cancel the work unseen.
            await asyncio.wait({work})
        except asyncio.CancelledError:
            ctx.cancel.set()
            work.cancel()
            await wait_out(work)
            if work.cancelled() or isinstance(work.result(), ToolOutcome):
                raise
            result = work.result()
            assert isinstance(result, ToolResult)
            # The tool succeeded anyway: that is the call's settlement.
            raise SucceededThenInterrupted(await finish(self._bounded(tool, result, ctx))) from None
        if work.cancelled():
            return ToolOutcome.failure("aborted", f"Tool execution aborted: {tool.name}")
        settled = work.result()
        if isinstance(settled, ToolOutcome):
            return settled
        return await self._bounded(tool, settled, ctx)

    async def _bounded(self, tool: Tool, result: ToolResult, ctx: ToolContext) -> ToolOutcome:
        def work() -> ToolOutcome:
            try:
                return ToolOutcome.success(self._bounding.bound(result))
            except Exception as exc:
                logger.warning("bounding the output of %r failed", tool.name, exc_info=True)
                return ToolOutcome.failure("tool.error", f"bounding tool output failed: {exc}")

        try:
            # A cancel event of its own: bounding a success is never skipped.
            return await self._actors.run(work, call_id=ctx.call_id, cancel=CancelEvent())
        except ActorDeadError as exc:
            return ToolOutcome.failure("aborted", f"Tool execution aborted: {tool.name} ({exc})")

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

    def _outcome(self, tool: Tool, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
        """The child's Run (on its thread): run the tool, then bound a success.

        Any exception but :class:`ToolError` escapes: it is the actor's failure,
        which its ``on_failure`` turns into a ``tool.error`` settlement.
        """
        try:
            result: object = tool.run(input, ctx)
        except ToolError as exc:
            return ToolOutcome.from_error(exc)
        if not isinstance(result, ToolResult):
            raise TypeError(f"tool {tool.name!r} returned {type(result).__name__}")
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


async def _arun(
    tool: AsyncTool, input: Mapping[str, Any], ctx: ToolContext
) -> ToolResult | ToolOutcome:
    """An async tool's result, or its failure as an outcome (only a cancellation escapes)."""
    try:
        result: object = await tool.arun(input, ctx)
    except ToolError as exc:
        return ToolOutcome.from_error(exc)
    except Exception as exc:
        logger.warning("tool %r failed", tool.name, exc_info=True)
        text = str(exc)
        return ToolOutcome.failure(
            "tool.error", f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        )
    if not isinstance(result, ToolResult):
        return ToolOutcome.failure(
            "tool.error", f"tool {tool.name!r} returned {type(result).__name__}"
        )
    return result
