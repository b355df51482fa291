"""One step: a model call streamed into durable events (tool calls: :mod:`actors.tool_calls`).

Order of facts for a step (all carry ``assistantMessageID``):
``step.started`` -> text/reasoning ``started``/``ended`` (deltas live only)
-> per tool ``tool.input.started``/``ended`` -> ``tool.called`` (durable
*before* the tool starts) -> the tool's single terminal -> ... -> exactly one
``step.ended`` or ``step.failed`` once every call has settled.

Tool calls start eagerly, as soon as the model finishes each one, and run
concurrently; their terminals are published one at a time. Events that need
not be awaited are submitted and committed with the next group commit; the
step awaits durability where it matters (before a tool runs, and at its end).

Interrupts: the drain task is cancelled; running tools are cancelled (a
subprocess is killed with its process group), each still publishes its failed
terminal, then the step publishes ``step.failed {type: "aborted"}`` and the
cancellation continues upward.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import attrs

from actors._shield import finish
from actors.agents import Agent
from actors.bus import EventBus
from actors.llm import (
    Finish,
    ModelRequest,
    ProviderError,
    ProviderRegistry,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputDelta,
    ToolInputEnd,
    ToolInputStart,
)
from actors.tool_calls import ToolCalls
from actors.tools import ToolExecutor, ToolOutcome, ToolRegistry
from protocol import events as ev
from protocol import ids
from protocol.shapes import Session
from storage import Command, RecordedEvent, SQLiteStore, now_ms

__all__ = ["StepOutcome", "StepRunner"]


@attrs.frozen(kw_only=True)
class StepOutcome:
    needs_continuation: bool = False
    #: Set when the step failed in a way that fails the execution.
    error: ev.ErrorInfo | None = None


class _Step:
    """The mutable bookkeeping of one running step."""

    def __init__(self, store: SQLiteStore, session_id: str, assistant_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.assistant_id = assistant_id
        self.submitted: list[asyncio.Future[list[RecordedEvent]]] = []
        self.texts: dict[int, list[str]] = {}
        self.inputs: dict[str, list[str]] = {}
        self.calls: ToolCalls

    def emit(self, event: ev.Event) -> None:
        self.submitted.append(self.store.submit(Command.of(event)))

    async def durable(self, event: ev.Event) -> None:
        self.emit(event)
        await asyncio.shield(self.submitted[-1])

    async def flushed(self) -> None:
        """Everything submitted so far is committed (or its failure raised)."""
        pending, self.submitted = self.submitted, []
        for future in pending:
            await asyncio.shield(future)


class StepRunner:
    def __init__(
        self,
        *,
        store: SQLiteStore,
        bus: EventBus,
        providers: ProviderRegistry,
        executor: ToolExecutor,
        tools: ToolRegistry,
        output_dir: Path,
        secret_env: frozenset[str] = frozenset(),
        server_dirs: tuple[Path, ...] = (),
    ) -> None:
        self._store = store
        self._secret_env = secret_env
        self._server_dirs = server_dirs
        self._bus = bus
        self._providers = providers
        self._executor = executor
        self._tools = tools
        self._output_dir = output_dir

    async def run(
        self, session: Session, agent: Agent, request: ModelRequest, *, limited: bool
    ) -> StepOutcome:
        step = _Step(self._store, session.id, ids.message_id())
        step.calls = ToolCalls(
            journal=step,
            session=session,
            agent=agent,
            assistant_id=step.assistant_id,
            bus=self._bus,
            executor=self._executor,
            output_dir=self._output_dir,
            secret_env=self._secret_env,
            server_dirs=self._server_dirs,
        )
        step.emit(
            ev.StepStarted(
                session_id=session.id,
                assistant_message_id=step.assistant_id,
                agent=agent.name,
                model=request.model,
                started=now_ms(),
            )
        )
        try:
            finished = await self._stream(step, session, agent, request, limited)
            outcomes = await step.calls.join()
        except asyncio.CancelledError:
            await finish(self._abort(step, "aborted", "Step interrupted"))
            raise
        except ProviderError as exc:
            error = ev.ErrorInfo(type=exc.type, message=exc.message)
            await finish(self._abort(step, error.type, error.message))
            return StepOutcome(error=error)
        return await self._end(step, finished, outcomes, limited)

    async def _stream(
        self, step: _Step, session: Session, agent: Agent, request: ModelRequest, limited: bool
    ) -> Finish | None:
        provider = self._providers.resolve(request.model)
        on = {"session_id": session.id, "assistant_message_id": step.assistant_id}
        async with contextlib.aclosing(provider.stream(request)) as stream:
            async for part in stream:
                match part:
                    case TextStart(ordinal=n):
                        step.texts[n] = []
                        step.emit(ev.TextStarted(**on, ordinal=n))
                    case TextDelta(ordinal=n, delta=d):
                        step.texts.setdefault(n, []).append(d)
                        self._bus.live(ev.TextDelta(**on, ordinal=n, delta=d))
                    case TextEnd(ordinal=n):
                        text = "".join(step.texts.pop(n, []))
                        step.emit(ev.TextEnded(**on, ordinal=n, text=text))
                    case ReasoningStart(ordinal=n):
                        step.texts[n] = []
                        step.emit(ev.ReasoningStarted(**on, ordinal=n))
                    case ReasoningDelta(ordinal=n, delta=d):
                        step.texts.setdefault(n, []).append(d)
                        self._bus.live(ev.ReasoningDelta(**on, ordinal=n, delta=d))
                    case ReasoningEnd(ordinal=n):
                        text = "".join(step.texts.pop(n, []))
                        step.emit(ev.ReasoningEnded(**on, ordinal=n, text=text))
                    case ToolInputStart(id=call_id, name=name):
                        step.inputs[call_id] = []
                        step.calls.input_started(call_id, name)
                        step.emit(ev.ToolInputStarted(**on, id=call_id, name=name))
                    case ToolInputDelta(id=call_id, delta=d):
                        step.inputs.setdefault(call_id, []).append(d)
                        self._bus.live(ev.ToolInputDelta(**on, id=call_id, delta=d))
                    case ToolInputEnd(id=call_id):
                        step.emit(
                            ev.ToolInputEnded(
                                **on,
                                id=call_id,
                                text="".join(step.inputs.pop(call_id, [])),
                            )
                        )
                    case ToolCall():
                        await step.calls.called(part, limited=limited)
                        if step.calls.denied is not None:
                            return None  # a declined permission interrupts the step
                    case Finish():
                        return part
        return None

    async def _abort(self, step: _Step, type_: str, message: str) -> None:
        await step.calls.cancel()
        step.calls.fail_unfinished("Tool input interrupted")
        step.emit(
            ev.StepFailed(
                session_id=step.session_id,
                assistant_message_id=step.assistant_id,
                error=ev.ErrorInfo(type=type_, message=message),
            )
        )
        await step.flushed()

    async def _end(
        self, step: _Step, finished: Finish | None, outcomes: list[ToolOutcome], limited: bool
    ) -> StepOutcome:
        sid, aid = step.session_id, step.assistant_id
        step.calls.fail_unfinished("The model never completed the tool call")
        if step.calls.denied is not None:
            step.emit(
                ev.StepFailed(
                    session_id=sid,
                    assistant_message_id=aid,
                    error=ev.ErrorInfo(
                        type="aborted", message=f"Permission denied: {step.calls.denied}"
                    ),
                )
            )
            await step.flushed()
            return StepOutcome()
        if finished is None or finished.reason in ("unknown", "content-filter"):
            if finished is None:
                error = ev.ErrorInfo(
                    type="provider.incomplete-stream", message="The model stream ended early"
                )
            elif finished.reason == "content-filter":
                error = ev.ErrorInfo(
                    type="provider.content-filter", message="The provider filtered the response"
                )
            else:
                error = ev.ErrorInfo(
                    type="provider.incomplete-stream", message="Unknown finish reason"
                )
            usage = finished.usage if finished is not None else None
            step.emit(
                ev.StepFailed(
                    session_id=sid,
                    assistant_message_id=aid,
                    error=error,
                    finish=None if finished is None else finished.reason,
                    cost=None if usage is None else usage.cost,
                    tokens=None if usage is None else _tokens(usage),
                )
            )
            await step.flushed()
            return StepOutcome(error=error)
        step.emit(
            ev.StepEnded(
                session_id=sid,
                assistant_message_id=aid,
                finish=finished.reason,
                cost=finished.usage.cost,
                tokens=_tokens(finished.usage),
            )
        )
        await step.flushed()
        return StepOutcome(
            needs_continuation=finished.reason == "tool-calls" and bool(outcomes) and not limited
        )


def _tokens(usage: Any) -> ev.StepTokens:
    return ev.StepTokens(
        input=usage.input,
        output=usage.output,
        reasoning=usage.reasoning,
        cache_read=usage.cache_read,
        cache_write=usage.cache_write,
    )
