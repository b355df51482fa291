"""The runner: one drain of one session, step after step, from projected history.

A drain (called by the session's busy period) works like this:

1. At drain start, tool calls still projected as streaming/running belong to
   an earlier process or an interrupted step: they fail with ``aborted``,
   keeping their assistant message, before any model work. Nothing is replayed.
2. Before each step, at the Safe Step Boundary: sample the session's agent and
   model (a switch applies from the next step on), prepare instructions (a
   hook; no sources yet), promote input — steers at every boundary while the
   drain continues, one queued item only at the idle boundary — and reload the
   projected history. Promotion that delivers input resets the step allowance.
3. Run the step (:mod:`actors.step`). If it needs a continuation (the model
   called tools), loop: the continuation is a new step built from history,
   never an in-memory tool loop. Otherwise go back to the idle boundary, where
   the next queued item (if the drain's scope allows) starts a new turn.

A failed step ends the drain with :class:`StepFailedError`, which fails the
execution with the step's error.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from actors._threaded import BlockingRunner
from actors.agents import Agent, AgentCatalogs
from actors.bus import EventBus
from actors.history import CHAT_CACHE_BYTES, ChatCache, to_chat
from actors.inbox import Scope
from actors.llm import SCRIPTED_MODEL, ModelRequest, ProviderRegistry, ToolSpec, with_max_steps
from actors.reaper import kill_recorded, stale_failure
from actors.sessions import Sessions
from actors.shells import Environments
from actors.snapshots import Snapshots
from actors.step import StepRunner, retry_policy
from actors.tools import ToolExecutor, ToolRegistry, permission
from protocol import events as ev
from protocol.errors import InvalidRequestError, SessionNotFoundError
from protocol.shapes import AssistantMessage, ModelRef, Session
from storage import Command, SQLiteStore

__all__ = [
    "AgentUnavailableError",
    "InstructionSource",
    "NoInstructions",
    "Runner",
    "StepFailedError",
]


class StepFailedError(Exception):
    """A step ended in ``session.step.failed``; the execution fails with its error."""

    def __init__(self, error: ev.ErrorInfo) -> None:
        super().__init__(error.message)
        self.type = error.type


class AgentUnavailableError(Exception):
    """The session's agent is not in its Location's catalog, or the catalog is unreadable."""

    type: Final = "agent.unavailable"


class InstructionSource(Protocol):
    """Prepares instructions at each Safe Step Boundary (the instructions issue fills it)."""

    async def prepare(self, session: Session, agent: Agent) -> None: ...


class NoInstructions:
    async def prepare(self, session: Session, agent: Agent) -> None:
        return None


class Runner:
    def __init__(
        self,
        *,
        store: SQLiteStore,
        sessions: Sessions,
        providers: ProviderRegistry,
        tools: ToolRegistry,
        executor: ToolExecutor,
        blocking: BlockingRunner,
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
    ) -> None:
        self._store = store
        self._default_model = default_model
        self._sessions = sessions
        self._providers = providers
        self._tools = tools
        self._blocking = blocking
        self._agents = agents
        self._chat = ChatCache(chat_cache_bytes)
        self._instructions = instructions or NoInstructions()
        self._steps = StepRunner(
            store=store,
            bus=bus,
            providers=providers,
            executor=executor,
            output_dir=output_dir,
            tools=tools,
            secret_env=secret_env,
            server_dirs=server_dirs,
            retry=retry_policy(retry_base_delay_s, retry_max_delay_s),
            snapshots=snapshots,
            environments=environments,
        )

    @property
    def chat_cache(self) -> ChatCache:
        return self._chat

    async def drain(self, session_id: str, scope: Scope, force: bool) -> None:
        try:
            session = await self._sessions.get(session_id)
        except SessionNotFoundError:
            return  # deleted meanwhile: nothing to run
        await self.fail_stale_tools(session_id)
        continuing = False
        first = True
        step = 0
        while True:
            delivered = await self._sessions.promote(session_id, "steer" if continuing else scope)
            if delivered:
                step = 0  # new input resets the allowance, once per batch
            idle = not continuing and not delivered
            if idle and not (first and force and await self._awaits_reply(session_id)):
                return
            if not first:
                # Sampled again before every later step: a switch of agent or
                # model applies from the next step on. The first step uses the
                # read made at drain start, a moment ago.
                session = await self._sessions.get(session_id)
            first = False
            agent = await self._agent(session)
            await self._instructions.prepare(session, agent)
            step += 1
            limited = agent.steps is not None and step >= agent.steps
            request = await self._request(session, agent, step, limited)
            outcome = await self._steps.run(
                session,
                agent,
                request,
                limited=limited,
                rebuild=functools.partial(self._request, session, agent, step, limited),
            )
            if outcome.error is not None:
                raise StepFailedError(outcome.error)
            continuing = outcome.needs_continuation

    async def _agent(self, session: Session) -> Agent:
        """The session's agent, sampled before every step like the session itself.

        One that is not configured (any more) fails the execution: nothing
        runs as the default agent in its place.
        """
        try:
            return await self._agents.agent(session.location.directory, session.agent)
        except InvalidRequestError as exc:
            raise AgentUnavailableError(exc.message) from None

    async def fail_stale_tools(self, session_id: str) -> int:
        """Fail every tool call still open in the projection (never replay it).

        Any process group such a call recorded is killed first: it was started
        by a process that is gone (this session's own tools have all settled
        before a drain starts), and may still be about to do its side effect.
        """
        await kill_recorded(self._blocking, await self._store.queries.tool_processes(session_id))
        stale = await self._store.queries.open_tool_calls(session_id)
        for call in stale:
            await self._store.append(
                Command.of(stale_failure(session_id, call.assistant_message_id, call.id, call.name))
            )
        # The step that owned them (or one cut off while streaming or waiting
        # out a retry) gets its terminal too, after its calls: a message
        # without one would read as still running forever.
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

    async def _request(
        self, session: Session, agent: Agent, step: int, limited: bool, native: bool = True
    ) -> ModelRequest:
        """The step's request from projected history (again for a later attempt).

        ``native=False`` leaves out provider-native continuation state: the
        full rebuild after a provider rejected it.
        """
        history = await self._store.queries.context(session.id)
        # Only what the agent may call is offered; a call to anything else
        # still fails (ToolCalls checks again), but the model is not invited.
        allowed = [t.name for t in self._tools if permission(agent.permissions, t.name) == "allow"]
        metadata: dict[str, Any] = {"step": step, "attempt": 1}
        script = _script(agent, session.metadata)
        if script is not None:
            metadata["script"] = script
        request = ModelRequest(
            session_id=session.id,
            agent=agent.name,
            model=session.model or agent.model or self._default_model,
            system=(agent.system,) if agent.system else (),
            messages=to_chat(history, self._chat, native=native),
            tools=tuple(
                ToolSpec(name=s.name, description=s.description, input_schema=s.input_schema)
                for s in self._tools.specs(allowed)
            ),
            metadata=metadata,
        )
        return with_max_steps(request) if limited else request

    async def _awaits_reply(self, session_id: str) -> bool:
        """A forced resume with nothing to deliver runs only if the transcript wants it."""
        history = await self._store.queries.context(session_id)
        if not history:
            return False
        last = history[-1]
        if not isinstance(last, AssistantMessage):
            return True
        return last.finish == "tool-calls" and last.error is None


def _script(agent: Agent, metadata: Mapping[str, Any] | None) -> str | None:
    if metadata is not None and isinstance(metadata.get("script"), str):
        return str(metadata["script"])
    return agent.script
