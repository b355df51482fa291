"""One step: physical attempts at a model call, streamed into durable events.

Order of facts for a step (all carry ``assistantMessageID``):
``step.started`` -> text/reasoning ``started``/``ended`` (deltas live only)
-> per tool ``tool.input.started``/``ended`` -> ``tool.called`` (durable
*before* the tool starts) -> the tool's single terminal -> ... -> exactly one
``step.ended`` or ``step.failed`` once every call has settled. A hosted call
(the provider runs it) is recorded the same way, settles when its
``HostedResult`` streams in, and fails with ``tool.result-missing`` if the
stream finished without one; it never makes the step continue. Tool calls are
owned by :class:`~actors.session.tool_calls.ToolCalls`, one per assistant message.

The record starts at the first output (glossary: "A Step record covers only
the model-visible span from first assistant output through tool settlement;
pre-flight leaves no record, and one Step settles at most one record"). The
assistant message id is allocated before the first call (``retry.scheduled``
names it), but ``step.started`` is written only with the first text,
reasoning or tool input the model streams (or with the terminal of an answer
that had none). A failure or an interrupt before any output, or during a
retry wait, leaves no assistant message: the execution's terminal carries
the error. A retry, the rebuild without native continuation state and the
overflow-triggered compaction's rebuild all happen before output, so they
stay inside the one record, under the same id.

A step makes one physical attempt, or several (seeds, "One Step May Have
Several Physical Attempts"; reference §4.4, §4.6). After a failed attempt:

- **retry**: a rate limit, a provider-internal failure, a transport failure
  not known to be delivered, or an incomplete stream, *before* any durable
  output: ``session.retry.scheduled {attempt, at, error}``, sleep until
  ``at``, try again with the same assistant message id (no step allowance used),
  its request rebuilt after instruction admission (a source changed during
  the wait reaches the model in this attempt);
- **continue**: an incomplete stream *after* durable output: the partial
  message fails (``step.failed``, its text kept), the wait is scheduled the
  same way, a synthetic continuation instruction is recorded and a new
  assistant message carries on. It spends the same retry budget;
- **rebuild**: the provider rejected the history's native continuation state
  (a reasoning signature): once, at once, without ``retry.scheduled``, the
  request is rebuilt without any of it;
- otherwise the step fails and so does the execution: authentication, quota,
  invalid request, a context overflow compaction cannot fix (after output, a
  second one, automatic compaction off: see ``compact``), a content
  filter, a spent budget (the first try plus four retries), or any exception
  that is not a provider's (a bug: it still settles everything first).

Partial output is never lost: on failure or interrupt every open text or
reasoning block is closed durably with what streamed, then the started tool
calls settle, then the step's terminal (when it has a record). An interrupt
(the drain task is cancelled) ends a backoff at once; a step with a record
fails as ``aborted``.

Live deltas never overtake their part: a delta waits until its part's
``*.started`` has committed, since durable events reach subscribers only
after COMMIT while live ones go out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs

from actors.agents import Agent
from actors.event_bus import EventBus
from actors.files.snapshots import WRITING_TOOLS, Recorded, Snapshots, StepWrites
from actors.instructions.nearby import NearbyInstructions
from actors.kit import finish
from actors.llm import (
    ContextOverflowError,
    ContinuationRejectedError,
    Finish,
    HostedResult,
    IncompleteStreamError,
    ModelRequest,
    ProviderError,
    ProviderRegistry,
    ReasoningChunk,
    ReasoningEnd,
    ReasoningStart,
    RetryPolicy,
    TextChunk,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
    Usage,
)
from actors.permissions import PermissionWaiters
from actors.session.shells import Environments
from actors.session.tool_calls import Blocking, ToolCalls
from actors.tools import ToolExecutor, ToolOutcome, ToolRegistry
from protocol import events as ev
from protocol import ids
from protocol.shapes import Session
from storage import Command, FencedError, RecordedEvent, StorageError, Store, now_ms
from storage.clock import SYSTEM, Clock

__all__ = [
    "CONTINUE_DESCRIPTION",
    "CONTINUE_TEXT",
    "Compact",
    "Rebuild",
    "StepOutcome",
    "StepRunner",
    "retry_policy",
    "step_tokens",
]

log = logging.getLogger(__name__)

#: The synthetic instruction recorded before continuing a cut-off answer.
CONTINUE_TEXT: Final = (
    "Your previous response was cut off before it finished. Continue exactly where it"
    " stopped, without repeating what you already wrote."
)
CONTINUE_DESCRIPTION: Final = "Continuing after an incomplete response"

#: Builds the step's request again from projected history, after admitting
#: what changed in the instruction sources; ``native=False`` leaves out every
#: provider-native continuation state (a full rebuild).
Rebuild = Callable[[bool], Awaitable[ModelRequest]]
#: Runs the overflow-triggered compaction; True when it completed.
Compact = Callable[[], Awaitable[bool]]


@attrs.frozen(kw_only=True)
class StepOutcome:
    needs_continuation: bool = False
    #: Set when the step failed in a way that fails the execution.
    error: ev.ErrorInfo | None = None


class _Live:
    """Live deltas held back until the durable event before them has committed."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._held: list[tuple[asyncio.Future[Any], ev.Event]] = []

    @property
    def listening(self) -> bool:
        """Whether a delta would reach anyone: with nobody on the bus and nothing
        held, the stream skips making one (the bus keeps no history anyway)."""
        return bool(self._held) or self._bus.listening

    def publish(self, event: ev.Event, gate: asyncio.Future[Any] | None) -> None:
        if not self._held and (gate is None or gate.done()):
            self._bus.live(event)
            return
        assert gate is not None or self._held
        held_gate = gate if gate is not None else self._held[-1][0]
        self._held.append((held_gate, event))
        if len(self._held) == 1:
            held_gate.add_done_callback(self._release)

    def _release(self, _: object = None) -> None:
        while self._held:
            gate, event = self._held[0]
            if not gate.done():
                gate.add_done_callback(self._release)
                return
            self._held.pop(0)
            self._bus.live(event)

    async def drain(self) -> None:
        """Publish every held delta (waiting for its gate) before what comes next."""
        while self._held:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._held[-1][0])
            self._release()


def _abandoned(future: asyncio.Future[list[RecordedEvent]]) -> None:
    """Retrieve a failed emit's error, which an awaiter (if any) still gets.

    A step cancelled or failed part-way leaves emits nobody awaits: after a
    lost lease every one of them fails (fenced), which is expected; any other
    failure reaches the step through the emit it awaits next (the log keeps
    the rest, at debug level, so an awaited failure is not reported twice).
    """
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None and not isinstance(exc, FencedError):
        log.debug("an event of the step failed: %s", exc)


class _Journal:
    """Where one attempt's events go: submitted in order, the live deltas held
    behind them; what the attempt's tool calls write through.

    Apart from the attempt, which holds it, so that the attempt's tool calls
    (which hold the journal) and the attempt (which holds them) make no
    reference cycle: an attempt's objects go when the step is done, not at
    the next pass of the cyclic collector.
    """

    def __init__(self, store: Store, bus: EventBus) -> None:
        self.store = store
        self.submitted: list[asyncio.Future[list[RecordedEvent]]] = []
        self.live = _Live(bus)

    def emit(self, event: ev.Event) -> None:
        future = self.store.submit(Command.of(event))
        future.add_done_callback(_abandoned)
        self.submitted.append(future)

    async def durable(self, event: ev.Event) -> None:
        self.emit(event)
        await asyncio.shield(self.submitted[-1])

    def gate(self) -> asyncio.Future[Any] | None:
        return self.submitted[-1] if self.submitted else None

    async def flushed(self) -> None:
        """Everything submitted so far is committed (or its failure raised)."""
        await self.live.drain()
        pending, self.submitted = self.submitted, []
        for future in pending:
            await asyncio.shield(future)


class _Attempt:
    """The mutable bookkeeping of one physical attempt (one assistant message)."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        session_id: str,
        assistant_id: str,
        record: ev.StepStarted,
    ):
        self.journal = _Journal(store, bus)
        self.session_id = session_id
        self.assistant_id = assistant_id
        #: The step's ``step.started``, written at its first output (:meth:`begin`).
        self.record = record
        #: Open text/reasoning blocks: ordinal -> (kind, pieces streamed so far).
        self.blocks: dict[int, tuple[str, list[str]]] = {}
        self.inputs: dict[str, list[str]] = {}
        #: Native continuation state seen so far (reasoning signatures by ordinal).
        self.signatures: dict[str, str] = {}
        #: Whether anything of the answer is durable yet, so the step has its
        #: record (then a retry would contradict what the user saw: the step
        #: continues instead).
        self.output = False
        self.calls: ToolCalls
        #: The step's snapshots around its writing calls (None without a store).
        self.writes: StepWrites | None = None

    @property
    def provider_state(self) -> dict[str, Any] | None:
        return {"reasoning": dict(self.signatures)} if self.signatures else None

    def begin(self) -> None:
        """The first output: the step's record starts (before the output's own event)."""
        if not self.output:
            self.output = True
            self.journal.emit(self.record)


class StepRunner:
    def __init__(
        self,
        *,
        store: Store,
        bus: EventBus,
        providers: ProviderRegistry,
        executor: ToolExecutor,
        tools: ToolRegistry,
        output_dir: Path,
        secret_env: frozenset[str] = frozenset(),
        server_dirs: tuple[Path, ...] = (),
        retry: RetryPolicy | None = None,
        snapshots: Snapshots | None = None,
        environments: Environments | None = None,
        waiters: PermissionWaiters | None = None,
        blocking: Blocking | None = None,
        nearby: NearbyInstructions | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        #: What the retry backoff waits on (and its ``at`` is read from).
        self._clock = clock
        self._blocking = blocking
        self._nearby = nearby
        self._waiters = PermissionWaiters() if waiters is None else waiters
        self._store = store
        self._snapshots = snapshots
        self._environments = environments
        self._secret_env = secret_env
        self._server_dirs = server_dirs
        self._bus = bus
        self._providers = providers
        self._executor = executor
        self._tools = tools
        self._output_dir = output_dir
        self._retry = retry or RetryPolicy()

    async def run(
        self,
        session: Session,
        agent: Agent,
        request: ModelRequest,
        *,
        limited: bool,
        rebuild: Rebuild | None = None,
        compact: Compact | None = None,
    ) -> StepOutcome:
        """Run one logical step to its terminal; raises only CancelledError (re-raised).

        ``compact`` (None when automatic compaction is off) runs the one
        overflow-triggered compaction a step may have; the same logical step
        is then rebuilt from the compacted history, under the same assistant
        message id (no record was written: the overflow came before output).
        """
        policy = attrs.evolve(self._retry)  # a fresh budget (and generator state) per step
        assistant_id = ids.message_id()
        dispatched = now_ms()  # the record's ``started``, whenever it is written
        physical = 0  # physical attempts made, for request.metadata["attempt"]
        retries = 0  # generic retries and continuations spent
        rebuilt = False
        compacted = False
        while True:
            physical += 1
            step = self._attempt(session, agent, assistant_id, request, dispatched)
            attempt = attrs.evolve(request, metadata={**request.metadata, "attempt": physical})
            try:
                finished = await self._stream(step, attempt, limited)
                if finished is None or finished.reason == "unknown":
                    raise IncompleteStreamError(
                        "the model stream ended early"
                        if finished is None
                        else "the model finished for an unknown reason"
                    )
                outcomes = await step.calls.join()
            except asyncio.CancelledError:
                await finish(
                    self._fail(step, ev.ErrorInfo(type="aborted", message="Step interrupted"))
                )
                raise
            except ProviderError as exc:
                error = ev.ErrorInfo(type=exc.type, message=exc.message)
                if isinstance(exc, ContinuationRejectedError) and not step.output:
                    if rebuilt or rebuild is None:
                        return await self._failed(step, error)
                    # One immediate full-context rebuild, no scheduled retry.
                    await finish(self._discard(step))
                    rebuilt = True
                    request = await rebuild(False)
                    continue
                if isinstance(exc, ContextOverflowError):
                    if step.output or compact is None or compacted or rebuild is None:
                        return await self._failed(
                            step, _overflow(error, step.output, compact is None, compacted)
                        )
                    # Before any output (so no record yet): one compaction
                    # runs, the same step starts over after it, same id.
                    await finish(self._discard(step))
                    compacted = True
                    if not await compact():
                        return StepOutcome(
                            error=ev.ErrorInfo(
                                type=error.type,
                                message="The request exceeds the model's context window"
                                f" and compacting the session failed: {error.message}",
                            )
                        )
                    request = await rebuild(True)
                    continue
                retries += 1
                delay = policy.decide(exc, retries)
                if delay is None:
                    return await self._failed(step, error)
                if not step.output:
                    await finish(self._discard(step))
                    await self._backoff(session.id, assistant_id, retries, delay, error)
                    if rebuild is not None:
                        # Sources are read before every physical attempt: what
                        # changed during the wait is admitted before the retry.
                        request = await rebuild(not rebuilt)
                    continue
                if not isinstance(exc, IncompleteStreamError) or rebuild is None:
                    return await self._failed(step, error)
                # Cut off after output: keep the partial message, continue in a new one.
                await finish(self._fail(step, error))
                await self._backoff(session.id, assistant_id, retries, delay, error)
                await step.journal.durable(
                    ev.SyntheticRecorded(
                        session_id=session.id,
                        message_id=ids.message_id(),
                        text=CONTINUE_TEXT,
                        description=CONTINUE_DESCRIPTION,
                        metadata={"notice": "continue", "after": assistant_id},
                    )
                )
                assistant_id, dispatched = ids.message_id(), now_ms()
                request = await rebuild(True)
                continue
            except FencedError:
                # This host lost the session's lease: nothing more of the step
                # may be written (its new holder fails what was left open).
                raise
            except Exception as exc:
                if isinstance(exc, StorageError):
                    # The database, not a bug: its message is the news (a
                    # traceback per step of an outage is noise).
                    log.warning("step of %s stopped: %s", session.id, exc)
                else:
                    # A bug, not weather: fail the step cleanly (every call
                    # settled, the partial kept) and let the execution fail with it.
                    log.exception("step of %s failed unexpectedly", session.id)
                error = ev.ErrorInfo(type="unknown", message=f"{type(exc).__name__}: {exc}")
                return await self._failed(step, error)
            return await self._end(step, finished, outcomes, limited)

    async def _recorded(self, step: _Attempt) -> Recorded | None:
        """The attempt's file snapshots, if it ran a writing tool in a git work tree."""
        if step.writes is None or not (step.calls.ran_tools & WRITING_TOOLS):
            return None
        return await step.writes.record()

    def _attempt(
        self,
        session: Session,
        agent: Agent,
        assistant_id: str,
        request: ModelRequest,
        dispatched: int,
    ) -> _Attempt:
        record = ev.StepStarted(
            session_id=session.id,
            assistant_message_id=assistant_id,
            agent=agent.name,
            model=request.model,
            started=dispatched,
        )
        step = _Attempt(self._store, self._bus, session.id, assistant_id, record)
        if self._snapshots is not None:
            step.writes = StepWrites(self._snapshots, session.location.directory)
        nearby = (
            None
            if self._nearby is None
            else self._nearby.for_step(session.id, session.location.directory, step.journal.durable)
        )
        step.calls = ToolCalls(
            journal=step.journal,
            session=session,
            agent=agent,
            assistant_id=assistant_id,
            bus=self._bus,
            executor=self._executor,
            output_dir=self._output_dir,
            secret_env=self._secret_env,
            server_dirs=self._server_dirs,
            environment=(
                None if self._environments is None else self._environments.variables(session.id)
            ),
            waiters=self._waiters,
            blocking=self._blocking,
            session_rules=functools.partial(self._store.queries.permission_rules, session.id),
            before_run=None if step.writes is None else step.writes.before_run,
            after_success=None if nearby is None else nearby.after_success,
        )
        return step

    async def _backoff(
        self,
        session_id: str,
        assistant_id: str,
        attempt: int,
        delay_ms: int,
        error: ev.ErrorInfo,
    ) -> None:
        """Publish the retry, then wait for it; an interrupt ends the wait at once.

        Nothing else to settle then: a retry comes before any output (no
        record), a continuation after its message failed.
        """
        at = self._clock.now_ms() + delay_ms
        event = ev.RetryScheduled(
            session_id=session_id,
            assistant_message_id=assistant_id,
            attempt=attempt,
            at=at,
            error=error,
        )
        await self._store.append(Command.of(event))
        await self._clock.sleep(max(0, at - self._clock.now_ms()) / 1000)

    async def _stream(self, step: _Attempt, request: ModelRequest, limited: bool) -> Finish | None:
        provider = self._providers.resolve(request.model)
        on = {"session_id": step.session_id, "assistant_message_id": step.assistant_id}
        async with contextlib.aclosing(provider.stream(request)) as stream:
            async for part in stream:
                match part:
                    case TextStart(ordinal=n) | ReasoningStart(ordinal=n):
                        text = isinstance(part, TextStart)
                        step.blocks[n] = ("text" if text else "reasoning", [])
                        step.begin()
                        step.journal.emit(
                            ev.TextStarted(**on, ordinal=n)
                            if text
                            else ev.ReasoningStarted(**on, ordinal=n)
                        )
                    case TextChunk(ordinal=n, delta=d):
                        step.blocks.setdefault(n, ("text", []))[1].append(d)
                        if step.journal.live.listening:
                            step.journal.live.publish(
                                ev.TextDelta(**on, ordinal=n, delta=d), step.journal.gate()
                            )
                    case ReasoningChunk(ordinal=n, delta=d):
                        step.blocks.setdefault(n, ("reasoning", []))[1].append(d)
                        if step.journal.live.listening:
                            step.journal.live.publish(
                                ev.ReasoningDelta(**on, ordinal=n, delta=d), step.journal.gate()
                            )
                    case TextEnd(ordinal=n) | ReasoningEnd(ordinal=n):
                        if isinstance(part, ReasoningEnd) and part.signature:
                            step.signatures[str(n)] = part.signature
                        await self._close(step, n)
                    case ToolInputStart(id=call_id, name=name):
                        step.inputs[call_id] = []
                        step.begin()
                        step.calls.input_started(call_id, name)
                        step.journal.emit(ev.ToolInputStarted(**on, id=call_id, name=name))
                    case ToolInputChunk(id=call_id, delta=d):
                        step.inputs.setdefault(call_id, []).append(d)
                        if step.journal.live.listening:
                            step.journal.live.publish(
                                ev.ToolInputDelta(**on, id=call_id, delta=d), step.journal.gate()
                            )
                    case ToolInputEnd(id=call_id):
                        await step.journal.live.drain()
                        step.journal.emit(
                            ev.ToolInputEnded(
                                **on,
                                id=call_id,
                                text="".join(step.inputs.pop(call_id, [])),
                            )
                        )
                    case ToolCall(hosted=True):
                        step.begin()
                        await step.calls.hosted(part)
                    case ToolCall():
                        # tool.called is durable output: retrying the message from
                        # scratch would forget a call that may have run.
                        step.begin()
                        await step.calls.called(part, limited=limited)
                    case HostedResult():
                        step.begin()
                        await step.calls.hosted_result(part)
                    case Finish():
                        return part
        return None

    async def _close(self, step: _Attempt, ordinal: int) -> None:
        """Close a text/reasoning block durably with what streamed into it."""
        kind, pieces = step.blocks.pop(ordinal, ("text", []))
        step.begin()  # a block whose start never came is output all the same
        await step.journal.live.drain()  # its deltas go out before its end
        on = {"session_id": step.session_id, "assistant_message_id": step.assistant_id}
        text = "".join(pieces)
        step.journal.emit(
            ev.TextEnded(**on, ordinal=ordinal, text=text)
            if kind == "text"
            else ev.ReasoningEnded(**on, ordinal=ordinal, text=text)
        )

    async def _discard(self, step: _Attempt) -> None:
        """An attempt that failed before any output: nothing to close, no terminal yet."""
        await step.calls.cancel()
        await step.journal.flushed()

    async def _failed(self, step: _Attempt, error: ev.ErrorInfo) -> StepOutcome:
        await finish(self._fail(step, error))
        return StepOutcome(error=error)

    async def _fail(self, step: _Attempt, error: ev.ErrorInfo) -> None:
        """The attempt's terminal after a failure: partial output kept, every call settled.

        Before any output there is no record to fail: the execution's terminal
        carries ``error``.
        """
        for ordinal in sorted(step.blocks):
            await self._close(step, ordinal)
        if not step.output:
            await self._discard(step)
            return
        await step.calls.cancel()
        step.calls.fail_unfinished("Tool input interrupted")
        # What its writing calls changed stays revertible after a failure too.
        recorded = await self._recorded(step)
        step.journal.emit(
            ev.StepFailed(
                session_id=step.session_id,
                assistant_message_id=step.assistant_id,
                error=error,
                provider_state=step.provider_state,
                **_snapshot_fields(recorded),
            )
        )
        await step.journal.flushed()

    async def _end(
        self,
        step: _Attempt,
        finished: Finish,
        outcomes: list[ToolOutcome],
        limited: bool,
    ) -> StepOutcome:
        sid, aid = step.session_id, step.assistant_id
        step.begin()  # an answer with no output at all still settles one record
        step.calls.fail_unfinished("The model never completed the tool call")
        await step.calls.fail_hosted_missing()
        if finished.reason == "content-filter":
            # The partial content stays visible; the step (and execution) fail.
            error = ev.ErrorInfo(
                type="provider.content-filter", message="The provider filtered the response"
            )
            step.journal.emit(
                ev.StepFailed(
                    session_id=sid,
                    assistant_message_id=aid,
                    error=error,
                    finish=finished.reason,
                    cost=finished.usage.cost,
                    tokens=step_tokens(finished.usage),
                    provider_state=step.provider_state,
                )
            )
            await step.journal.flushed()
            return StepOutcome(error=error)
        recorded = await self._recorded(step)
        step.journal.emit(
            ev.StepEnded(
                session_id=sid,
                assistant_message_id=aid,
                finish=finished.reason,
                cost=finished.usage.cost,
                tokens=step_tokens(finished.usage),
                provider_state=step.provider_state,
                **_snapshot_fields(recorded),
            )
        )
        await step.journal.flushed()
        return StepOutcome(
            needs_continuation=finished.reason == "tool-calls" and bool(outcomes) and not limited
        )


def _snapshot_fields(recorded: Recorded | None) -> dict[str, Any]:
    if recorded is None:
        return {}
    return {"before": recorded.before, "snapshot": recorded.after, "files": recorded.files}


def _overflow(error: ev.ErrorInfo, output: bool, off: bool, again: bool) -> ev.ErrorInfo:
    """The terminal error of an overflow that compaction cannot (or may no more) fix."""
    if again:
        why = "still exceeds the model's context window after compaction"
    elif output:
        why = "exceeded the model's context window after output was recorded"
    elif off:
        why = "exceeds the model's context window and automatic compaction is off"
    else:
        why = "exceeds the model's context window"
    return ev.ErrorInfo(type=error.type, message=f"The request {why}: {error.message}")


def retry_policy(base_delay_s: float, max_delay_s: float) -> RetryPolicy:
    """The step's policy from ``[runtime] retry_base_delay_s`` / ``retry_max_delay_s``."""
    return RetryPolicy(
        base_ms=max(1, math.ceil(base_delay_s * 1000)),
        retry_after_cap_ms=max(0, math.ceil(max_delay_s * 1000)),
    )


def step_tokens(usage: Usage) -> ev.StepTokens:
    """A model's reported usage as the tokens a step (or a compaction) records."""
    return ev.StepTokens(
        input=usage.input,
        output=usage.output,
        reasoning=usage.reasoning,
        cache_read=usage.cache_read,
        cache_write=usage.cache_write,
    )
