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

A *hosted* call (``ToolCall.hosted``: the provider executes it, e.g. a web
search) is recorded the same way (``tool.called`` with ``providerExecuted``)
but never dispatched: :meth:`ToolCalls.hosted_result` settles it when the
provider's result arrives (``tool.success``, or ``tool.failed`` with
``tool.error`` when the provider reports an error), and
:meth:`ToolCalls.fail_hosted_missing` fails, before the step's terminal,
every hosted call whose result never came (``tool.result-missing``). Its
terminals carry ``metadata.providerExecuted`` and the provider's own result
block (``metadata.result``), which history replays natively. Hosted calls
have no outcome in :meth:`ToolCalls.join`: only local outcomes make a step
continue.

A call whose input streamed but never completed is failed by
:meth:`ToolCalls.fail_unfinished` (``executed: false``); a tool the agent
may not use fails with ``permission.denied`` without running, and the step
goes on: the model sees the failure in the next step's history and can react.

Permission, before dispatch: each call is judged by
:func:`actors.permissions.judge` (the agent's rules, the session's
``always`` rules, the call's subjects). A rule that says ``ask`` makes the
call wait: ``session.permission.asked`` is durable, then the call waits for
its reply in :class:`~actors.permissions.PermissionWaiters`; ``reject``
fails it with ``permission.rejected``. A call failed before it ran (denied,
rejected, interrupted while waiting) has ``executed: false``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from actors.agents import Agent
from actors.event_bus import EventBus
from actors.kit import finish
from actors.llm import TOOLS_DISABLED_ERROR, HostedResult, ToolCall
from actors.permissions import FILE_TOOLS, Check, PermissionWaiters, judge, summary
from actors.tools import (
    Progress,
    SucceededThenInterrupted,
    ToolContext,
    ToolExecutor,
    ToolOutcome,
    ToolOwner,
    permission,
)
from actors.tools._permission import EXTERNAL_DIRECTORY, offered
from protocol import events as ev
from protocol import ids
from protocol.shapes import Session

__all__ = ["HOSTED", "Journal", "SessionRules", "ToolCalls", "hosted_text"]

log = logging.getLogger(__name__)

#: The metadata key that marks a hosted (provider-executed) call's terminal.
HOSTED: Final = "providerExecuted"
#: The most characters of a hosted result kept as its text content.
HOSTED_TEXT_MAX: Final = 16_000

#: The session's ``always`` rules, ``(permission, pattern)``, read when a call is judged.
SessionRules = Callable[[], Awaitable[Sequence[tuple[str, str]]]]


#: Runs a blocking callable off the loop (the runtime's bounded BlockingExecutor).
Blocking = Callable[[Callable[[], Any]], Awaitable[Any]]
#: Awaited with a call's tool name and input just before the call runs.
BeforeRun = Callable[[str, Mapping[str, Any]], Awaitable[None]]


async def _no_rules() -> Sequence[tuple[str, str]]:
    return ()


async def _to_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


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
        environment: Mapping[str, str] | None = None,
        waiters: PermissionWaiters | None = None,
        session_rules: SessionRules = _no_rules,
        blocking: Blocking | None = None,
        before_run: BeforeRun | None = None,
        after_success: BeforeRun | None = None,
    ) -> None:
        #: Awaited just before a call runs (the step's "before" snapshot of what it may write).
        self._before_run = before_run
        #: Awaited after a success is durable (nearby AGENTS.md injection).
        self._after_success = after_success
        #: Where path resolution for a file tool's permission runs (it reads symlinks).
        self._blocking: Blocking = _to_thread if blocking is None else blocking
        self._waiters = PermissionWaiters() if waiters is None else waiters
        self._session_rules = session_rules
        self._journal = journal
        self._session = session
        self._agent = agent
        self._assistant_id = assistant_id
        self._bus = bus
        self._executor = executor
        self._output_dir = output_dir
        self._secret_env = secret_env
        self._server_dirs = server_dirs
        self._environment = environment or {}
        #: Names of the tools this step ran (a write, edit or bash makes a snapshot).
        self.ran_tools: set[str] = set()
        #: The paths write/edit calls named (a snapshot need only look at these
        #: when no bash ran).
        self.written_paths: set[str] = set()
        #: Calls whose input started streaming but that were never completed (id -> name).
        self._unfinished: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[ToolOutcome]] = {}
        #: Calls whose ``tool.called`` is durable and whose terminal is not yet (id -> name).
        self._open: dict[str, str] = {}
        #: Hosted calls whose ``tool.called`` is submitted and whose result is not in (id -> name).
        self._hosted: dict[str, str] = {}
        #: Calls whose task began to run (so the tool may have executed).
        self._ran: set[str] = set()
        self._terminals = asyncio.Lock()
        #: The step's child actors, one per running call; they report Progress
        #: here, through a function that holds no reference back to these calls
        #: (a bound method would make a cycle only the collector could undo).
        self._owner = ToolOwner(on_progress=_progress_to(bus, session.id, assistant_id))

    def input_started(self, call_id: str, name: str) -> None:
        self._unfinished[call_id] = name

    async def called(self, call: ToolCall, *, limited: bool) -> None:
        """Record ``call`` durably, then start it (or its refusal)."""
        # On the books before anything is submitted: an interrupt while
        # tool.called commits must still leave a call to settle.
        self._unfinished.setdefault(call.id, call.name)
        # Durable before any side effect: after a crash the call is known, and
        # is failed as stale rather than silently run twice.
        await self._journal.durable(self._called_event(call))
        refusal: ToolOutcome | None = None
        if limited:
            refusal = ToolOutcome.failure("tool.disabled", TOOLS_DISABLED_ERROR)
        loop = asyncio.get_running_loop()
        self._open[call.id] = call.name
        self._tasks[call.id] = loop.create_task(self._settle(call, refusal), name=f"tool:{call.id}")
        del self._unfinished[call.id]  # from here on its task owns its terminal

    async def hosted(self, call: ToolCall) -> None:
        """Record the provider-executed ``call`` durably; it is never run here."""
        self._unfinished.pop(call.id, None)
        self._hosted[call.id] = call.name
        await self._journal.durable(self._called_event(call, provider_executed=True))
        self._open[call.id] = call.name

    def _called_event(
        self, call: ToolCall, *, provider_executed: bool | None = None
    ) -> ev.ToolCalled:
        return ev.ToolCalled(
            session_id=self._session.id,
            assistant_message_id=self._assistant_id,
            id=call.id,
            name=call.name,
            input=dict(call.input),
            provider_executed=provider_executed,
        )

    async def hosted_result(self, result: HostedResult) -> None:
        """Settle the hosted call ``result.id`` with what the provider returned.

        A result for a call this step never recorded as hosted (or already
        settled) is dropped with a warning: a call has exactly one terminal.
        """
        name = self._hosted.pop(result.id, None)
        if name is None or result.id not in self._open:
            log.warning("hosted result for unknown call %r dropped", result.id[:64])
            return
        text = hosted_text(result.content)
        metadata = {HOSTED: True, "result": dict(result.content)}
        outcome = (
            _hosted_failure("tool.error", f"The provider's {name} call failed: {text}", metadata)
            if result.error
            else ToolOutcome(
                status="success", content=({"type": "text", "text": text},), metadata=metadata
            )
        )
        await self._terminal(result.id, outcome)

    async def fail_hosted_missing(self) -> None:
        """Fail every hosted call still without a result: the stream is over."""
        for call_id, name in list(self._hosted.items()):
            del self._hosted[call_id]
            missing = _hosted_failure(
                "tool.result-missing",
                f"The provider returned no result for its {name} call",
                {HOSTED: True},
            )
            await finish(self._terminal(call_id, missing))

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
            hosted = self._hosted.pop(call_id, None) is not None
            never_ran = _hosted_failure(
                "aborted", f"Tool execution interrupted: {name}", {HOSTED: True} if hosted else {}
            )
            await finish(
                self._terminal(call_id, never_ran, executed=hosted or call_id in self._ran)
            )

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
        external: tuple[Path, ...] = ()
        if refusal is None:
            try:
                refusal, external = await self._authorise(call)
            except asyncio.CancelledError:
                # Interrupted before it ran (perhaps while waiting for an answer).
                interrupted = ToolOutcome.failure(
                    "aborted", f"Tool execution interrupted: {call.name}"
                )
                await finish(self._terminal(call.id, interrupted, executed=False))
                raise
        if refusal is not None:
            await finish(self._terminal(call.id, refusal, executed=False))
            return refusal
        self._ran.add(call.id)
        session = self._session
        ctx = ToolContext(
            session_id=session.id,
            call_id=call.id,
            assistant_message_id=self._assistant_id,
            directory=Path(session.location.directory),
            output_dir=self._output_dir,
            config_writes=permission(self._agent.permissions, "config") == "allow",
            secret_env=self._secret_env,
            server_dirs=self._server_dirs,
            external=external,
            environment=self._environment,
        )
        self.ran_tools.add(call.name)
        if call.name in ("write", "edit") and isinstance(call.input.get("path"), str):
            self.written_paths.add(call.input["path"])
        try:
            if self._before_run is not None:
                await self._before_run(call.name, call.input)
            outcome = await self._executor.execute(call.name, call.input, ctx, owner=self._owner)
        except SucceededThenInterrupted as late:
            # The tool's operation happened: its success is the settlement.
            await finish(self._terminal(call.id, late.outcome))
            raise
        except asyncio.CancelledError:
            interrupted = ToolOutcome.failure("aborted", f"Tool execution interrupted: {call.name}")
            await finish(self._terminal(call.id, interrupted))
            raise
        await finish(self._terminal(call.id, outcome))
        if outcome.status == "success" and self._after_success is not None:
            try:
                await self._after_success(call.name, call.input)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The call succeeded; only its follow-up did not happen.
                log.warning("after the %s call of %s", call.name, self._session.id, exc_info=True)
        return outcome

    async def _authorise(self, call: ToolCall) -> tuple[ToolOutcome | None, tuple[Path, ...]]:
        """A refusal, or None and the outside paths the call was granted.

        Waits (durably asked) for every check that says ``ask``.
        """
        agent = self._agent
        rules = await self._session_rules()
        judged = functools.partial(
            judge,
            agent.permissions,
            rules,
            call.name,
            call.input,
            directory=Path(self._session.location.directory),
            output_dir=self._output_dir,
        )
        # Only a file tool's path is resolved (blocking: it reads symlinks).
        checks = await self._blocking(judged) if call.name in FILE_TOOLS else judged()
        external: list[Path] = []
        for check in checks:
            if check.decision == "deny":
                denied = _denied(agent, call, check)
                return ToolOutcome.failure("permission.denied", denied), ()
            if check.decision == "ask" and await self._ask(call, check) == "reject":
                return ToolOutcome.failure(
                    "permission.rejected",
                    f"Permission rejected: the user declined this {call.name} call"
                    f" ({check.permission}: {', '.join(check.patterns)})",
                ), ()
            external.extend(check.external)
        return None, tuple(external)

    async def _ask(self, call: ToolCall, check: Check) -> ev.PermissionReply:
        permission_id = ids.permission_id()
        reply = self._waiters.register(permission_id)
        try:
            await self._journal.durable(
                ev.PermissionAsked(
                    session_id=self._session.id,
                    id=permission_id,
                    tool=call.name,
                    call_id=call.id,
                    assistant_message_id=self._assistant_id,
                    permission=check.permission,
                    summary=summary(call.name, call.input),
                    patterns=check.patterns,
                    always=check.always,
                )
            )
            return await reply
        finally:
            self._waiters.discard(permission_id)

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


def _progress_to(bus: EventBus, session_id: str, assistant_id: str) -> Callable[[Progress], None]:
    def progress(message: Progress) -> None:
        """A child's Progress (on the loop): published live, never stored."""
        bus.live(
            ev.ToolProgress(
                session_id=session_id,
                assistant_message_id=assistant_id,
                id=message.call_id,
                metadata=dict(message.metadata),
            )
        )

    return progress


def _denied(agent: Agent, call: ToolCall, check: Check) -> str:
    name = agent.name
    if check.permission == EXTERNAL_DIRECTORY:
        where = ", ".join(str(p) for p in check.external)
        return (
            f"Permission denied: agent {name} may not use paths outside the session's"
            f" directory ({where})"
        )
    if offered(agent.permissions, call.name):  # denied for this subject, not the whole tool
        return f"Permission denied: agent {name} may not use the {call.name} tool on this input"
    return f"Permission denied: agent {name} may not use the {call.name} tool"


def hosted_text(content: Mapping[str, Any]) -> str:
    """A hosted result block as text for the model and the user, bounded."""
    inner = content.get("content", content)
    text = inner if isinstance(inner, str) else orjson.dumps(inner).decode()
    if len(text) > HOSTED_TEXT_MAX:
        return text[:HOSTED_TEXT_MAX] + "\n[hosted result truncated]"
    return text


def _hosted_failure(type: str, message: str, metadata: Mapping[str, Any]) -> ToolOutcome:
    return ToolOutcome(status="failed", error={"type": type, "message": message}, metadata=metadata)
