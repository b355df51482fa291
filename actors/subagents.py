"""Subagents: the ``task`` tool hands a sub-task to an agent in a child session.

A ``task`` call ``{description, prompt, agent}`` (``agent`` defaults to the
built-in ``general``; it must be an agent of mode ``subagent`` or ``all``):

1. creates a child session: ``parentID`` the calling session, the same
   Location, the named agent, the caller's selected model unless the agent
   names one, ``metadata.task = {"depth": n, "callID": …}``;
2. reports the child's id as the call's live progress, admits the prompt
   (without a wake) and resumes the child: its execution is its own (its own
   log, claim, lease and terminal), and only it is active while it runs;
3. waits for the child's terminal and returns the child's final text (the
   text of its last assistant message) as the call's result, bounded like any
   output, with ``metadata.sessionID`` the child's id. A child that failed or
   was interrupted fails the call (``task.failed`` / ``task.interrupted``,
   the child's id in the failure's metadata).

It is an async tool (:class:`~actors.tools.AsyncTool`): the call waits on
the loop and holds no tool thread, so children can run their own tools
whatever the number of waiting parents. It goes through everything a tool
goes through: permissions (``task = "deny"`` hides it, ``"ask"`` asks), a
durable ``tool.called`` first, one terminal.

Cascades: interrupting the call (the parent's interrupt, shutdown, the
parent's deletion) interrupts the child and waits for it to stop before the
call settles; deleting a session deletes its children (the session facade).
After a crash, the sweep fails an orphaned child's claim (``aborted``) and
resumes the parent, whose drain fails the ``task`` call that was running as
stale: a child's work is never started again by a replay.

Recursion is bounded: a child's depth is its caller's plus one, at most
``max_depth`` (``[runtime] subagent_max_depth``); a session runs at most
``max_children`` tasks at once (``[runtime] subagent_max_children``). Over
either, the call fails at once (``task.limit``) and the model may go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Final, Protocol

import attrs

from actors.agents import Agent, AgentCatalogs
from actors.kit import finish
from actors.session import Terminal
from actors.sessions import Sessions
from actors.tools import CallContext, FunctionTool, ToolError, ToolResult
from protocol.errors import InvalidRequestError
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import AssistantMessage, Session, TextPart
from storage import Store

__all__ = [
    "DEFAULT_MAX_CHILDREN",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_SUBAGENT",
    "TASK_TOOL",
    "ChildRuns",
    "Subagents",
]

log = logging.getLogger(__name__)

TASK_TOOL: Final = "task"
DEFAULT_SUBAGENT: Final = "general"
DEFAULT_MAX_DEPTH: Final = 2
DEFAULT_MAX_CHILDREN: Final = 4
#: The most of the child's transcript read back for its final text (newest first).
_FINAL_WINDOW: Final = 20

_DESCRIPTION: Final = """\
Hand a self-contained sub-task to a subagent, which works on it in a child session \
of its own (same directory, its own tools) and answers once it is done. Its final \
message is returned to you; nothing else of its work is. Write the prompt as a \
complete brief: the subagent does not see this conversation. Use it for work that \
is independent and would otherwise fill your context: research across many files, \
a separate change, a review. The built-in subagent is "general"; the operator may \
define more (agents of mode "subagent" or "all")."""


class ChildRuns(Protocol):
    """How the task tool runs a child session and stops it (the runtime)."""

    async def resume(self, session_id: str) -> Terminal:
        """Start or join the session's execution; its terminal."""
        ...

    async def stop_child(self, session_id: str) -> None:
        """Interrupt the child's execution (as the parent's interrupt) and wait for it."""
        ...


@attrs.frozen(kw_only=True)
class _Task:
    description: str
    prompt: str
    agent: str


class Subagents:
    """The ``task`` tool's service (one per runtime); :attr:`tool` is the tool."""

    def __init__(
        self,
        *,
        sessions: Sessions,
        agents: AgentCatalogs,
        store: Store,
        runs: ChildRuns,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_children: int = DEFAULT_MAX_CHILDREN,
    ) -> None:
        if max_depth < 0 or max_children < 1:
            raise ValueError("subagent_max_depth must be >= 0 and subagent_max_children >= 1")
        self._sessions = sessions
        self._agents = agents
        self._store = store
        self._runs = runs
        self.max_depth = max_depth
        self.max_children = max_children
        #: Tasks running now, by calling session (an entry lives while one runs:
        #: bounded by the sessions running here).
        self._running: dict[str, int] = {}
        self.tool = self._make_tool()

    def _make_tool(self) -> FunctionTool:
        subagents = self

        async def task(
            ctx: CallContext,
            description: Annotated[str, "A short (3-5 words) title of the task"],
            prompt: Annotated[str, "The complete brief for the subagent"],
            agent: Annotated[str, "The subagent to run it (default: general)"] = DEFAULT_SUBAGENT,
        ) -> ToolResult:
            return await subagents.run(
                ctx, _Task(description=description, prompt=prompt, agent=agent)
            )

        return FunctionTool(task, name=TASK_TOOL, description=_DESCRIPTION)

    async def run(self, ctx: CallContext, task: _Task) -> ToolResult:
        caller = await self._sessions.get(ctx.session_id)
        depth = _depth(caller.metadata) + 1
        if depth > self.max_depth:
            raise ToolError(
                f"Subagents may nest {self.max_depth} deep; this session is already at"
                f" depth {depth - 1}",
                type="task.limit",
            )
        running = self._running.get(caller.id, 0)
        if running >= self.max_children:
            raise ToolError(
                f"At most {self.max_children} subagents run at once per session",
                type="task.limit",
            )
        # Counted before the next await: calls of one step start together.
        self._running[caller.id] = running + 1
        try:
            agent = await self._subagent(caller.location.directory, task.agent)
            return await self._run(ctx, caller, agent, task, depth)
        finally:
            left = self._running[caller.id] - 1
            if left:
                self._running[caller.id] = left
            else:
                del self._running[caller.id]

    async def _subagent(self, directory: str, name: str) -> Agent:
        try:
            catalog = await self._agents.load(directory)
        except InvalidRequestError as exc:
            raise ToolError(exc.message) from None
        agent = catalog.agents.get(name)
        usable = sorted(n for n, a in catalog.agents.items() if a.mode != "primary")
        if agent is None or agent.mode == "primary":
            raise ToolError(
                f"{name!r} is not a subagent; subagents here: {', '.join(usable) or 'none'}",
                type="invalid-input",
            )
        return agent

    async def _run(
        self,
        ctx: CallContext,
        parent: Session,
        agent: Agent,
        task: _Task,
        depth: int,
    ) -> ToolResult:
        child = await self._sessions.create(
            CreateSessionInput(
                parent_id=parent.id,
                title=f"{task.description} (@{agent.name} subagent)",
                agent=agent.name,
                model=None if agent.model is not None else parent.model,
                location=parent.location,
                metadata={"task": {"depth": depth, "callID": ctx.call_id}},
            )
        )
        meta = {"sessionID": child.id, "agent": agent.name}
        ctx.progress(**meta)
        await self._sessions.prompt(child.id, PromptInput(text=task.prompt, resume=False))
        try:
            terminal = await self._runs.resume(child.id)
        except asyncio.CancelledError:
            # The parent's call was interrupted: the child stops before it settles.
            await finish(self._runs.stop_child(child.id))
            raise
        if terminal.kind == "failed":
            error = terminal.error
            why = error.message if error is not None else "it failed"
            raise ToolError(
                f"The subagent's session {child.id} failed: {why}",
                type="task.failed",
                metadata=meta,
            )
        if terminal.kind != "succeeded":
            raise ToolError(
                f"The subagent's session {child.id} was {terminal.kind}"
                f" ({terminal.reason or 'no reason'})",
                type="task.interrupted",
                metadata=meta,
            )
        return ToolResult.text(await self._final_text(child.id), **meta)

    async def _final_text(self, session_id: str) -> str:
        page = await self._store.queries.messages(session_id, "desc", _FINAL_WINDOW, None)
        for message in page.data:
            if isinstance(message, AssistantMessage):
                text = "".join(p.text for p in message.parts if isinstance(p, TextPart))
                if text.strip():
                    return text
        return "(the subagent finished without a final message)"


def _depth(metadata: Mapping[str, Any] | None) -> int:
    task = (metadata or {}).get("task")
    depth = task.get("depth") if isinstance(task, Mapping) else None
    return depth if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0 else 0
