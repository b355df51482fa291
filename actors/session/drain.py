"""The drain: one session's steps, one after another, from projected history.

A drain (called by the session's busy period) works like this:

1. At drain start, tool calls still projected as streaming/running belong to
   an earlier process or an interrupted step: they fail with ``aborted``,
   keeping their assistant message, before any model work. Nothing is replayed.
2. Before each step, at the Safe Step Boundary, once the step is known to
   reach the model (something is promotable, or the drain continues): admit
   instructions (:mod:`.instruction_admission`: one delta when a source changed),
   *then* promote input — steers at every boundary while the drain continues,
   one queued item only at the idle boundary — so an update enters history
   before the input it precedes, and an unreadable first baseline leaves the
   input pending. Then read the session's agent and model (a switch applies
   from the next step on) and reload the projected history. Promotion that
   delivers input resets the step allowance.
3. Run the step (:mod:`actors.session.step`). If it needs a continuation (the model
   called tools), loop: the continuation is a new step built from history,
   never an in-memory tool loop. Otherwise go back to the idle boundary, where
   the next queued item (if the drain's scope allows) starts a new turn.

A failed step ends the drain with :class:`StepFailedError`, which fails the
execution with the step's error.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from actors.agents import Agent, AgentCatalogs
from actors.event_bus import EventBus
from actors.files.snapshots import Snapshots
from actors.instructions.nearby import NearbyInstructions
from actors.kit import BlockingExecutor
from actors.llm import (
    SCRIPTED_MODEL,
    ModelLimits,
    ModelRequest,
    ProviderRegistry,
    with_max_steps,
)
from actors.permissions import PermissionWaiters
from actors.reaper import kill_recorded, stale_failure
from actors.session.compaction import CompactionSettings, Compactor
from actors.session.history import CHAT_CACHE_BYTES, ChatCache, to_chat
from actors.session.inbox import Scope, control_head, select_promotable
from actors.session.messages import Own
from actors.session.shells import Environments
from actors.session.step import StepRunner, retry_policy
from actors.sessions import Sessions
from actors.tools import ToolExecutor, ToolRegistry, ToolSpec
from protocol import events as ev
from protocol.errors import InvalidRequestError, SessionNotFoundError
from protocol.shapes import (
    AssistantMessage,
    CompactionMessage,
    InboxItem,
    Location,
    ModelRef,
    Session,
    SessionMessage,
)
from storage import Boundary, Command, DrainStart, Store
from storage.clock import SYSTEM, Clock
from storage.queries import InstructionInputs

__all__ = [
    "AgentUnavailableError",
    "ControlHandler",
    "ControlUnsupportedError",
    "Drain",
    "InstructionSource",
    "McpTools",
    "NoInstructions",
    "StepFailedError",
]


#: Handles one control item at the head of the inbox (delivers it through the
#: session's actor if it is still due at this boundary's scope with this
#: held input, does its work).
#: Control items the actor may refuse in a row at one boundary (each after a
#: command changed the inbox) before the drain gives up instead of looping.
MAX_CONTROL_REFUSALS: Final = 8

ControlHandler = Callable[[Session, InboxItem, Own, Scope, Collection[str]], Awaitable[bool]]


class StepFailedError(Exception):
    """A step ended in ``session.step.failed``; the execution fails with its error."""

    def __init__(self, error: ev.ErrorInfo) -> None:
        super().__init__(error.message)
        self.type = error.type


class ControlUnsupportedError(Exception):
    """A control item this build has no handler for heads the inbox."""

    type: Final = "control.unsupported"


class AgentUnavailableError(Exception):
    """The session's agent is not in its Location's catalog, or the catalog is unreadable."""

    type: Final = "agent.unavailable"


class InstructionSource(Protocol):
    """Admits instructions at each Safe Step Boundary; returns the request's system text."""

    async def prepare(
        self, session: Session, agent: Agent, inputs: InstructionInputs | None = None
    ) -> tuple[str, ...]:
        """``inputs``: the session's instruction state and entries, when just read."""
        ...

    async def current(self, session: Session, agent: Agent) -> tuple[str, ...]:
        """The system text as stored now (after the epoch moved), admitting nothing."""
        ...


class McpTools(Protocol):
    """More tools by Location (:class:`actors.mcp.McpServers`)."""

    async def tools(self, directory: str) -> ToolRegistry: ...


class NoInstructions:
    """No sources: the agent's system prompt, as it is, and nothing admitted."""

    async def prepare(
        self, session: Session, agent: Agent, inputs: InstructionInputs | None = None
    ) -> tuple[str, ...]:
        return (agent.system,) if agent.system else ()

    async def current(self, session: Session, agent: Agent) -> tuple[str, ...]:
        return await self.prepare(session, agent)


class Drain:
    def __init__(
        self,
        *,
        store: Store,
        sessions: Sessions,
        providers: ProviderRegistry,
        tools: ToolRegistry,
        executor: ToolExecutor,
        blocking: BlockingExecutor,
        bus: EventBus,
        agents: AgentCatalogs,
        output_dir: Path,
        instructions: InstructionSource | None = None,
        secret_env: frozenset[str] = frozenset(),
        server_dirs: tuple[Path, ...] = (),
        default_model: ModelRef = SCRIPTED_MODEL,
        retry_base_delay_s: float = 2.0,
        retry_max_delay_s: float = 900.0,
        chat_cache_bytes: int = CHAT_CACHE_BYTES,
        snapshots: Snapshots | None = None,
        environments: Environments | None = None,
        compaction: CompactionSettings | None = None,
        model_limits: Callable[[ModelRef], ModelLimits | None] | None = None,
        waiters: PermissionWaiters | None = None,
        mcp: McpTools | None = None,
        nearby: NearbyInstructions | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        #: MCP servers' tools, by the session's Location (none configured: None).
        self._mcp = mcp
        self._default_model = default_model
        self._sessions = sessions
        self._providers = providers
        self._tools = tools
        self._blocking = blocking
        self._agents = agents
        self._chat = ChatCache(chat_cache_bytes)
        self._instructions = instructions or NoInstructions()
        retry = retry_policy(retry_base_delay_s, retry_max_delay_s)
        self._compactor = Compactor(
            store=store,
            bus=bus,
            providers=providers,
            retry=retry,
            limits=model_limits or (lambda model: None),
            settings=compaction,
            clock=clock,
        )
        #: What the drain does with a control item at the head of the inbox,
        #: by its type. A handler delivers the item (``Inbox.control``, with
        #: its own facts in the same command) and does its work; False when the
        #: actor found it no longer due (cancelled, or a steer now ahead of it).
        self.controls: dict[str, ControlHandler] = {
            "compaction": self._manual_compaction,
            "move": self._move,
        }
        self._steps = StepRunner(
            store=store,
            bus=bus,
            providers=providers,
            executor=executor,
            output_dir=output_dir,
            tools=tools,
            secret_env=secret_env,
            server_dirs=server_dirs,
            snapshots=snapshots,
            environments=environments,
            retry=retry,
            waiters=waiters,
            blocking=blocking.run,
            nearby=nearby,
            clock=clock,
        )

    @property
    def compactor(self) -> Compactor:
        return self._compactor

    @property
    def chat_cache(self) -> ChatCache:
        return self._chat

    async def drain(self, session_id: str, scope: Scope, force: bool, own: Own) -> None:
        """``own``: the session's actor, which this drain runs under and asks at
        each boundary for the read and the promotion (it is the session's only
        writer, so what it read is what it promotes from unless a command ran)."""
        # Everything the drain needs before its first boundary, in one read:
        # the session, anything a crash left open, the pending input, the
        # instruction inputs.
        inbox = self._sessions.inbox
        start = await own.command(
            functools.partial(inbox.drain_start, session_id), keeps_inbox=True
        )
        if start.session is None:
            return  # deleted meanwhile: nothing to run
        session = start.session
        pending: Boundary | None = Boundary(inbox=start.inbox, instructions=start.instructions)
        if await self._settle_stale(session_id, start):
            pending = None  # settling appended: read the boundary afresh
        continuing = False
        first = True
        step = 0
        refusals = 0  # control items the actor refused since the last delivery
        while True:
            promote_scope: Scope = "steer" if continuing else scope
            # One read at this boundary serves every question asked here (a
            # control item due, something promotable, the instruction state
            # admission compares with). The actor promotes from it only while
            # no other command of the session ran since (else it reads again),
            # so nothing decided here is stale there.
            if pending is None:
                pending = await own.command(
                    functools.partial(inbox.boundary, session_id), keeps_inbox=True
                )
            boundary, pending = pending, None
            held = await self._held(session)
            control = await self._control(
                session, promote_scope, boundary.inbox, held, own, idle=not continuing
            )
            if control == "delivered":
                first = False  # handled: the loop goes on from what follows it
                refusals = 0
                session = await self._sessions.get(session_id)
                continue
            if control is not None:
                # No longer due: a command changed the inbox since this read, so
                # read it again. Refused again and again, the drain and its actor
                # disagree on the rule: fail the busy period rather than loop.
                refusals += 1
                if refusals > MAX_CONTROL_REFUSALS:
                    raise RuntimeError(f"control item {control} refused {refusals} times")
                continue
            refusals = 0
            resumed = False
            if not continuing and not select_promotable(boundary.inbox, promote_scope, held):
                resumed = first and force and await self._awaits_reply(session_id)
                if not resumed:
                    return
            if not first:
                session = await self._sessions.get(session_id)
            first = False
            # Admission, then promotion: instruction updates enter history
            # before the input they precede; a blocked first baseline raises
            # here, with the input still pending.
            system = await self._instructions.prepare(
                session, await self._agent(session), boundary.instructions
            )
            promotion = await own.command(
                functools.partial(inbox.promote, session_id, promote_scope, held),
                keeps_inbox=True,
            )
            if promotion.delivered:
                step = 0  # new input resets the allowance, once per batch
            elif not continuing and not resumed:
                # What was promotable changed meanwhile (a cancel, or a delivery
                # change that makes a control item due first): look again, never
                # end on a stale read (ending here lost the wake that asked).
                continue
            # The agent and model this step runs with: read after admission
            # and promotion, never a read from before them (with the history,
            # in one round trip).
            current, history = await self._store.queries.step_inputs(session_id)
            if current is None:
                raise SessionNotFoundError(session_id)
            session = current
            agent = await self._agent(session)
            step += 1
            limited = agent.steps is not None and step >= agent.steps
            request = await self._request(session, agent, step, limited, system, history=history)
            auto = self._compactor.enabled(agent.compaction)
            if self._compactor.due(history, request, auto) is not None:
                failure = await self._compactor.run(
                    session.id,
                    request.model,
                    history,
                    "auto",
                    script=_script(agent, session.metadata),
                )
                if failure is not None:
                    # No request known to be over budget is sent: the step
                    # fails with the compaction's error, before any record.
                    raise StepFailedError(failure)
                # The epoch moved: the baseline is the new initial values.
                system = await self._instructions.current(session, agent)
                request = await self._request(session, agent, step, limited, system)
            outcome = await self._steps.run(
                session,
                agent,
                request,
                limited=limited,
                rebuild=functools.partial(self._rebuild, session, agent, step, limited),
                compact=functools.partial(self._overflow, session, agent, request.model)
                if auto
                else None,
            )
            if outcome.error is not None:
                raise StepFailedError(outcome.error)
            continuing = outcome.needs_continuation
            if not continuing and await own.command(
                functools.partial(inbox.nothing_due, scope, held), keeps_inbox=True
            ):
                return

    async def _held(self, session: Session) -> frozenset[str]:
        """Synthetic input held behind the session's staged revert: no boundary
        delivers it until the revert is cleared (then it is input like any
        other) or committed (then it is discarded). Nothing to read without one."""
        if session.revert is None:
            return frozenset()
        return frozenset(await self._store.queries.held_synthetic(session.id))

    async def _control(
        self,
        session: Session,
        scope: Scope,
        pending: list[InboxItem],
        held: Collection[str],
        own: Own,
        *,
        idle: bool,
    ) -> str | None:
        """Deliver the control item due at this boundary, if any: ``"delivered"``,
        None when none is due, or the item's id when the actor refused it as no
        longer due (a command changed the inbox since ``pending`` was read).

        Promotion never delivers control items and stops before them, so one
        at the head of the inbox would otherwise stall every later input.
        ``pending`` is the inbox as read at this boundary; ``idle``: not inside
        a turn. A drain rung for steers (scope ``steer``) leaves queued input
        parked, but at an idle boundary a queued control item at the head with
        a steer behind it delivers as at any idle boundary: the steer cannot
        cross it, so parking it would park the steer too, for good.
        """
        item = control_head(pending, scope, held)
        if item is None and scope == "steer" and idle:
            head = control_head(pending, "input", held)
            if head is not None and any(
                i.delivery == "steer" and i.id not in held for i in pending
            ):
                # Delivered as at an idle boundary: the actor checks it is due at that scope.
                item, scope = head, "input"
        if item is None:
            return None
        handler = self.controls.get(item.type)
        if handler is None:
            raise ControlUnsupportedError(f"control item {item.type!r} is not supported")
        return "delivered" if await handler(session, item, own, scope, held) else item.id

    async def _manual_compaction(
        self, session: Session, item: InboxItem, own: Own, scope: Scope, held: Collection[str]
    ) -> bool:
        started = ev.CompactionStarted(
            session_id=session.id, reason="manual", recent="", input_id=item.id
        )
        inbox = self._sessions.inbox
        deliver = functools.partial(
            inbox.control, session.id, item, (started,), scope=scope, held=held
        )
        if not await own.command(deliver):
            return False  # cancelled meanwhile, or a steer ahead of it now
        await self._compact_manually(session, item.id)
        return True

    async def _compact_manually(self, session: Session, input_id: str) -> None:
        """Run the manual compaction ``input_id``, its ``compaction.started`` durable."""
        agent = await self._agent(session)
        model = session.model or agent.model or self._default_model
        history = await self._store.queries.context(session.id)
        await self._compactor.run(
            session.id,
            model,
            history,
            "manual",
            script=_script(agent, session.metadata),
            input_id=input_id,
        )

    async def _move(
        self, session: Session, item: InboxItem, own: Own, scope: Scope, held: Collection[str]
    ) -> bool:
        """Deliver a move with ``session.moved`` in the same command.

        The drain then reads the session again before anything else, so the
        next step resolves its placement (agent catalog, instruction sources,
        tool directory) at the new Location; a continuing turn keeps its step
        count. Nothing of the model's is held across steps, so there is no
        transport to close.
        """
        location = Location(directory=str(item.payload["location"]["directory"]))
        moved = ev.SessionMoved(session_id=session.id, location=location)
        inbox = self._sessions.inbox
        delivered: bool = await own.command(
            functools.partial(inbox.control, session.id, item, (moved,), scope=scope, held=held)
        )
        return delivered

    async def _overflow(self, session: Session, agent: Agent, model: ModelRef) -> bool:
        """The one overflow-triggered compaction of a step."""
        history = await self._store.queries.context(session.id)
        failure = await self._compactor.run(
            session.id, model, history, "auto", script=_script(agent, session.metadata)
        )
        return failure is None

    async def _agent(self, session: Session) -> Agent:
        """The session's agent, sampled before every step like the session itself.

        One that is not configured (any more) fails the execution: nothing
        runs as the default agent in its place.
        """
        try:
            return await self._agents.agent(session.location.directory, session.agent)
        except InvalidRequestError as exc:
            raise AgentUnavailableError(exc.message) from None

    async def _settle_stale(self, session_id: str, start: DrainStart) -> bool:
        """Settle what a crash or restart left open, from the drain's first read.

        True when anything was appended. Nothing runs before this: stale
        tools fail (never replayed), then the step that owned them, then a
        compaction cut off while running.
        """
        failed = await self.fail_stale_tools(session_id, start)
        compaction = start.running_compaction
        if compaction is not None:
            again = await self._compactor.settle(session_id, compaction)
            if again is not None and start.session is not None:
                # A manual compaction the crash cut off runs again, once.
                await self._compact_manually(start.session, again)
        return bool(failed) or start.open_step is not None or compaction is not None

    async def fail_stale_tools(self, session_id: str, start: DrainStart | None = None) -> int:
        """Fail every tool call still open in the projection (never replay it).

        Any process group such a call recorded is killed first: it was started
        by a process that is gone (this session's own tools have all settled
        before a drain starts), and may still be about to do its side effect.
        ``start`` is the drain's first read, when the caller has it. Returns
        how many calls were failed.
        """
        if start is None:
            start = await self._store.queries.drain_start(session_id)
        await kill_recorded(self._blocking, start.tool_processes)
        stale = start.open_tool_calls
        # A call whose permission ask is still pending never started: a late
        # reply is refused (409), so it is recorded as never executed.
        pending = await self._store.queries.permission_requests(session_id) if stale else []
        asked = {(a.assistant_message_id, a.call_id) for a in pending}
        for call in stale:
            never_ran = (call.assistant_message_id, call.id) in asked
            await self._store.append(
                Command.of(
                    stale_failure(
                        session_id,
                        call.assistant_message_id,
                        call.id,
                        call.name,
                        executed=not never_ran,
                    )
                )
            )
        # The step that owned them (or one cut off while streaming: a step
        # cut off before its first output has no record) gets its terminal
        # too, after its calls: a message without one would read as still
        # running forever.
        # Read again after failing calls (the rare path): the step's state
        # is taken from after its calls settled, as it always was.
        open_step = start.open_step
        if stale:
            open_step = await self._store.queries.open_step(session_id)
        if open_step is not None:
            await self._store.append(
                Command.of(
                    ev.StepFailed(
                        session_id=session_id,
                        assistant_message_id=open_step,
                        error=ev.ErrorInfo(type="aborted", message="Step interrupted by a restart"),
                    )
                )
            )
        return len(stale)

    async def _rebuild(
        self, session: Session, agent: Agent, step: int, limited: bool, native: bool
    ) -> ModelRequest:
        """A later attempt's request. Instruction sources are read before every
        physical attempt, so what changed since the step began (during a retry
        wait, say) is admitted first; the baseline is read again too, as an
        overflow compaction may have moved the instruction epoch."""
        system = await self._instructions.prepare(session, agent)
        return await self._request(session, agent, step, limited, system, native)

    async def _request(
        self,
        session: Session,
        agent: Agent,
        step: int,
        limited: bool,
        system: tuple[str, ...],
        native: bool = True,
        *,
        history: Sequence[SessionMessage] | None = None,
    ) -> ModelRequest:
        """The step's request from projected history (again for a later attempt).

        ``native=False`` leaves out provider-native continuation state: the
        full rebuild after a provider rejected it. ``history`` is the active
        history when the caller has just read it.
        """
        if history is None:
            history = await self._store.queries.context(session.id)
        metadata: dict[str, Any] = {"step": step, "attempt": 1}
        script = _script(agent, session.metadata)
        if script is not None:
            metadata["script"] = script
        request = ModelRequest(
            session_id=session.id,
            agent=agent.name,
            model=session.model or agent.model or self._default_model,
            system=system,
            messages=to_chat(history, self._chat, native=native),
            # Only what the agent may call is offered; a call to anything else
            # still fails (ToolCalls checks again), but the model is not invited.
            tools=await self._offered(session, agent),
            metadata=metadata,
        )
        return with_max_steps(request) if limited else request

    async def _offered(self, session: Session, agent: Agent) -> tuple[ToolSpec, ...]:
        """The tools the agent may call: the runtime's, then its Location's MCP servers'."""
        specs = self._tools.offered_specs(agent.permissions)
        if self._mcp is None:
            return specs
        more = await self._mcp.tools(session.location.directory)
        return specs + tuple(
            spec for spec in more.offered_specs(agent.permissions) if spec.name not in self._tools
        )

    async def _awaits_reply(self, session_id: str) -> bool:
        """A forced resume with nothing to deliver runs only if the transcript wants it."""
        history = await self._store.queries.context(session_id)
        if not history:
            return False
        last = history[-1]
        if isinstance(last, CompactionMessage):
            # An automatic one runs right before a step that was due; a manual
            # one (or one that failed) asked for nothing more.
            return last.reason == "auto" and last.status == "completed"
        if not isinstance(last, AssistantMessage):
            return True
        return last.finish == "tool-calls" and last.error is None


def _script(agent: Agent, metadata: Mapping[str, Any] | None) -> str | None:
    if metadata is not None and isinstance(metadata.get("script"), str):
        return str(metadata["script"])
    return agent.script
