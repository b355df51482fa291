"""build_services: the runtime's parts, wired once.

:func:`build_services` makes every service of a runtime from its config and
its store, in dependency order, and returns them as one :class:`Services`
record. A part receives the services it uses, or a narrow Protocol one of
them satisfies (a :class:`~actors.session.inbox.Doorbell`, a
:class:`~actors.lease_keeper.LeaseLoss` …), at construction; nothing is wired
afterwards and no part holds a method of the :class:`~actors.runtime.Runtime`.
Nothing is opened here either: :class:`~actors.runtime.Runtime` starts and
enters them in order (and closes them in reverse).

One cycle is cut by an argument, not a reference: the drain reaches this
host's execution (through the sessions' doorbell, the lease keeper, the task
tool), so the :class:`DurableHooks` that run it are made after it and handed
to :meth:`HostExecution.start`, which opens the session actors with them.

:class:`HostExecution` is what those Protocols name where the runtime used to
lend its own methods: this host's execution while the runtime runs (the
doorbell, interrupts, lease losses, the stops of deleted
sessions, the tasks the runtime owns, and the wakes refused while closing).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from actors.agents import AgentCatalogs
from actors.event_bus import EventBus
from actors.files.locations import DirectoryRules
from actors.files.snapshots import Snapshots
from actors.generate import Generator
from actors.host_messages import HostBus, HostMessage, LocalHostBus, NotifyHostBus
from actors.instructions import InstructionEntries, project_config_disabled
from actors.instructions.nearby import NearbyInstructions
from actors.kit import BlockingExecutor
from actors.lease_keeper import LeaseKeeper
from actors.llm import SCRIPTED_MODEL, HttpProvider, ProviderRegistry, build_providers
from actors.mcp import McpServers
from actors.permissions import PermissionWaiters
from actors.session import ExecutionHooks, Own, Terminal, widest
from actors.session.compaction import CompactionSettings
from actors.session.drain import Drain
from actors.session.inbox import AdmissionGate, Scope
from actors.session.instruction_admission import Instructions
from actors.session.interrupts import UNHELD, RemoteInterrupts
from actors.session.revert import Reverts
from actors.session.shells import Environments, Shells
from actors.sessions import Sessions
from actors.subagents import Subagents
from actors.supervisor import Execution
from actors.tools import (
    OutputBounding,
    ProcessGroup,
    RecordProcess,
    ToolActors,
    ToolContext,
    ToolError,
    ToolExecutor,
    ToolRegistry,
    builtin_tools,
)
from actors.tools.builtin import BashTool
from actors.transfer import SessionTransfer
from protocol import events as ev
from protocol.errors import InvalidRequestError, ServiceUnavailableError
from storage import (
    Command,
    FencedError,
    ProjectionConflict,
    RecordedEvent,
    Store,
    default_host_id,
    fenced,
    is_server_url,
)
from storage.clock import SYSTEM, Clock
from storage.follow import FollowDispatcher

if TYPE_CHECKING:
    from actors.runtime import RuntimeConfig

__all__ = [
    "DurableHooks",
    "HostExecution",
    "HostMessageRouter",
    "Released",
    "Services",
    "build_services",
    "terminal_of",
]

log = logging.getLogger(__name__)


class HostExecution:
    """This host's execution while the runtime runs, for the parts that need it.

    Started by the runtime's open (:meth:`start`, with the drain's hooks)
    and stopped by its close (:meth:`stop`). Before and after, a wake is
    refused and nothing is busy.
    """

    def __init__(
        self,
        store: Store,
        host_id: str,
        host_bus: HostBus,
        shells: Shells,
        envs: Environments,
        execution: Execution,
        clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        self._clock = clock
        #: The session actors, opened by :meth:`start`.
        self._execution = execution
        self._host_id = host_id
        self._host_bus = host_bus
        self._shells = shells
        self._environments = envs
        #: The session actors while they run (:meth:`start` to :meth:`stop`).
        self._running: Execution | None = None
        #: Sessions this host settled with a shutdown terminal (released, claims kept).
        self._handed_over_ids: list[str] = []
        self._tasks: set[asyncio.Task[object]] = set()
        self._closing = False
        #: Wakes that arrived while closing (session id -> widest scope).
        self._refused: dict[str, Scope] = {}
        #: Set once :meth:`hand_over_wakes` has run (the bus closes next).
        self._handed_over = False

    @property
    def execution(self) -> Execution:
        """The session actors; ServiceUnavailableError unless they run."""
        if self._running is None:
            raise ServiceUnavailableError("the runtime is not running", service="execution")
        return self._running

    @property
    def closing(self) -> bool:
        """Whether :meth:`stop` has begun (wakes are refused from then on)."""
        return self._closing

    async def start(self, hooks: ExecutionHooks) -> None:
        """Open the session actors, their busy periods run by ``hooks``.

        The hooks come here, not to the constructor: they run the drain, which
        reaches this host's execution through the sessions (their doorbell),
        the lease keeper and the task tool, all made before it.
        """
        await self._execution.open(hooks)
        self._running = self._execution

    def released(self, session_id: str) -> None:
        """The :class:`Released` of the hooks: a shutdown terminal released the session."""
        self._handed_over_ids.append(session_id)

    # -- what the other parts call ----------------------------------------------------------------

    def wake(self, session_id: str, scope: Scope) -> None:
        """The :class:`~actors.session.inbox.Doorbell` of the sessions."""
        if self._closing:
            # Nothing new starts here any more: another host gets it at the end.
            self._refused[session_id] = widest(self._refused.get(session_id), scope)
            if self._handed_over:  # a host-bus wake (admissions are refused by now)
                log.info("wake for %s after this host handed its wakes over: dropped", session_id)
        elif self._running is not None:
            self._running.wake(session_id, scope)

    def lease_lost(self, session_id: str) -> None:
        """The :class:`~actors.lease_keeper.LeaseLoss` of the lease keeper."""
        if self._running is not None:
            self._running.lease_lost(session_id)

    async def interrupt_here(self, session_id: str) -> bool:
        execution = self._running
        return execution is not None and await execution.interrupt(session_id, "user")

    def spawn(self, work: Coroutine[Any, Any, object], name: str) -> None:
        """Run a task this host owns until it stops."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def locate(self, session_id: str) -> str | None:
        """Where a session runs, for :mod:`actors.session.interrupts`: another host's id,
        UNHELD (claimed, no other host's live lease), or None (not claimed).

        One read: a lease is taken with its claim and released with its end, so
        the claims (with their leases) say it all."""
        now = self._clock.now_ms()
        for claim in await self._store.queries.claims():
            if claim.session_id == session_id:
                lease = claim.lease
                if claim.orphaned(now) or lease is None or lease.host_id == self._host_id:
                    return UNHELD
                return lease.host_id
        return None

    async def resume(self, session_id: str) -> Terminal:
        """Start or join the session's execution, here or on the host that holds it."""
        execution = self.execution
        done: asyncio.Future[Terminal] = asyncio.get_running_loop().create_future()

        def watch(records: Sequence[RecordedEvent]) -> None:
            for r in records:
                if r.aggregate_id == session_id and not done.done():
                    terminal = terminal_of(r.event)
                    if terminal is not None:
                        done.set_result(terminal)

        # Subscribed first: the owner's terminal may come right after the hand-off.
        unsubscribe = self._store.subscribe(watch)
        try:
            terminal = await execution.resume(session_id)
            if terminal.kind != "elsewhere":
                return terminal
            return await asyncio.shield(done)
        finally:
            unsubscribe()

    async def stop_child(self, session_id: str) -> None:
        """A subagent's session stops with its parent's call: interrupted (as a
        shutdown while the runtime closes, its claim kept), waited for."""
        execution = self._running
        if execution is None:
            return
        await execution.interrupt(session_id, "shutdown" if self._closing else "user")
        await execution.wait_idle(session_id)

    async def stop_sessions(self, session_ids: Sequence[str]) -> None:
        """The :class:`~actors.sessions.Stops` of the sessions: they are being deleted."""
        for sid in session_ids:
            self._environments.forget(sid)
        # Their shells end with them.
        await self._shells.stop(session_ids, "cancelled")
        execution = self._running
        if execution is None:
            return
        # All at once: each interrupt kills its tools' groups; the waits overlap.
        await asyncio.gather(*(execution.interrupt(sid, "user") for sid in session_ids))
        await asyncio.gather(*(execution.wait_idle(sid) for sid in session_ids))

    def on_host_message(self, message: HostMessage, rescan: asyncio.Event) -> None:
        """A wake, resume or release from another host (interrupts go to RemoteInterrupts)."""
        execution = self._running
        if execution is None:
            return
        for sid in message.session_ids:
            if message.kind == "wake":
                self.wake(sid, message.scope)
            elif message.kind == "resume":
                self.spawn(execution.resume(sid), f"resume:{sid}")
        if message.kind == "released":
            rescan.set()

    # -- the end ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Interrupt every busy period (shutdown), end this host's tasks, announce releases."""
        self._closing = True
        execution = self._running
        if execution is not None:
            await execution.shutdown()
        self._running = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._handed_over_ids:
            # Released, claims kept: the other hosts need not wait for expiry.
            message = HostMessage(
                kind="released", origin=self._host_id, session_ids=tuple(self._handed_over_ids)
            )
            try:
                await self._host_bus.publish(None, message)
            except Exception:
                log.exception("announcing the released sessions failed")

    async def hand_over_wakes(self, gate: AdmissionGate) -> None:
        """Send the wakes refused while closing to the other hosts.

        The first other host to take each lease runs it (the rest hand their
        wake to that one). It runs as late as the bus allows, after execution
        stopped (which can take a tool's kill grace) and again for any wake
        refused while publishing: a wake refused after an earlier hand-over
        would otherwise reach no host, its input admitted but not run until
        the session's next wake.
        """
        # Admissions under way finish (and ring their wake) first; later ones get 503.
        await gate.close()
        while self._refused:
            refused, self._refused = self._refused, {}
            for scope in ("input", "steer"):
                ids = tuple(sid for sid, s in refused.items() if s == scope)
                if not ids:
                    continue
                wake = HostMessage(kind="wake", origin=self._host_id, session_ids=ids, scope=scope)
                try:
                    await self._host_bus.publish(None, wake)
                except Exception:
                    log.exception("handing over the wakes received while closing failed")
        self._handed_over = True


def terminal_of(event: ev.Event | None) -> Terminal | None:
    """The execution terminal an event records, if it is one."""
    match event:
        case ev.ExecutionSucceeded():
            return Terminal(kind="succeeded")
        case ev.ExecutionFailed(error=error):
            return Terminal(kind="failed", error=error)
        case ev.ExecutionInterrupted(reason=reason):
            return Terminal(kind="interrupted", reason=reason)
    return None


class HostMessageRouter:
    """What another host tells this one, each to its part: interrupts and their
    answers to the remote interrupts, wakes, resumes and releases to this
    host's execution."""

    def __init__(
        self, remote: RemoteInterrupts, host_execution: HostExecution, rescan: asyncio.Event
    ) -> None:
        self._remote = remote
        self._host_execution = host_execution
        self._rescan = rescan

    def __call__(self, message: HostMessage) -> None:
        if message.kind in ("interrupt", "answer"):
            # Answered even while execution stops (no, nothing ran here): the
            # sender would otherwise wait its whole timeout for a 503.
            self._remote.on_message(message)
            return
        self._host_execution.on_host_message(message, self._rescan)


class Released(Protocol):
    """Told of each session whose lease a shutdown terminal released (claim kept)."""

    def released(self, session_id: str) -> None: ...


class DurableHooks:
    """Execution hooks that publish the execution facts under the lease and run the drain."""

    def __init__(
        self, store: Store, drain: Drain, keeper: LeaseKeeper, bus: HostBus, released: Released
    ) -> None:
        self._store = store
        self._drain = drain
        self._keeper = keeper
        self._bus = bus
        self._released = released

    async def started(self, session_id: str) -> None:
        # The claim and the lease in one command; LeaseHeldError: it runs elsewhere.
        [record] = await self._store.append(
            Command.of(
                ev.ExecutionStarted(session_id=session_id), lease=self._keeper.take(session_id)
            )
        )
        assert record.epoch is not None
        self._keeper.hold(session_id, record.epoch)

    async def drain(self, session_id: str, scope: Scope, force: bool, own: Own) -> None:
        with fenced(self._keeper.fence(session_id)):
            await self._drain.drain(session_id, scope, force, own)

    async def settled(self, session_id: str, terminal: Terminal) -> None:
        if terminal.kind == "elsewhere":
            assert terminal.owner is not None
            message = HostMessage(
                kind="resume" if terminal.force else "wake",
                origin=self._keeper.host_id,
                session_ids=(session_id,),
                scope=terminal.scope,
            )
            await self._bus.publish(terminal.owner, message)
            return
        fence = self._keeper.fence(session_id)
        self._keeper.drop(session_id)
        if not terminal.written or fence is None:
            return  # lost the lease: the terminal is the new holder's to write
        event: ev.Event
        if terminal.kind == "succeeded":
            event = ev.ExecutionSucceeded(session_id=session_id)
        elif terminal.kind == "interrupted":
            event = ev.ExecutionInterrupted(session_id=session_id, reason=terminal.reason or "user")
        else:
            error = terminal.error or ev.ErrorInfo(type="unknown", message="execution failed")
            event = ev.ExecutionFailed(session_id=session_id, error=error)
        try:
            await self._store.append(Command.of(event, lease=fence.release()))
        except FencedError as exc:
            log.warning("the terminal of %s was fenced: %s", session_id, exc)
            return
        except ProjectionConflict as exc:
            if exc.reason != "session.missing":
                raise
            # The session was deleted while it ran: there is nothing to settle.
            return
        if terminal.kind == "interrupted" and terminal.reason == "shutdown":
            self._released.released(session_id)


def _process_recorder(store: Store, keeper: LeaseKeeper) -> RecordProcess:
    async def record(ctx: ToolContext, group: ProcessGroup) -> None:
        event = ev.ToolSpawned(
            session_id=ctx.session_id,
            assistant_message_id=ctx.assistant_message_id,
            id=ctx.call_id,
            pgid=group.pgid,
            start_ticks=group.start_ticks,
            boot_id=group.boot_id,
        )
        fence = keeper.fence(ctx.session_id)
        try:
            # Called from the tool's thread: the drain's fence is not in force here.
            await store.append(Command.of(event, lease=None if fence is None else fence.hold()))
        except FencedError as exc:
            raise ToolError(f"Tool execution aborted: {exc}", type="aborted") from None
        except ProjectionConflict as exc:
            # The session was deleted, or the call settled: the command must not run.
            raise ToolError(f"Tool execution aborted: {exc}", type="aborted") from None

    return record


@attrs.frozen(kw_only=True)
class Services:
    """The runtime's services, each made once (see :func:`build_services`)."""

    store: Store
    host_id: str
    host_bus: HostBus
    #: The bus the runtime made itself (over a server database), its own to open and close.
    own_bus: NotifyHostBus | None
    #: Set for a recovery scan at once (another host released sessions, the bus reconnected).
    rescan: asyncio.Event
    #: The session actors: every write to a session is a command one of them runs.
    execution: Execution
    #: This host's execution while the runtime runs (see :class:`HostExecution`).
    host_execution: HostExecution
    #: What a busy period does (:meth:`HostExecution.start` opens the actors with them).
    hooks: DurableHooks
    #: What a busy period runs: promotion at each boundary, the steps.
    drain: Drain
    #: One-off answers beside a session (``POST /session/{id}/generate``).
    generator: Generator
    #: The built-in instruction sources (opened and closed by the runtime), when
    #: the config names no source of its own.
    builtin_instructions: Instructions | None
    leases: LeaseKeeper
    remote_interrupts: RemoteInterrupts
    host_message_router: HostMessageRouter
    follows: FollowDispatcher
    bus: EventBus
    blocking: BlockingExecutor
    tool_actors: ToolActors
    tools: ToolRegistry
    bounding: OutputBounding
    adapters: dict[str, HttpProvider]
    providers: ProviderRegistry
    directories: DirectoryRules
    agents: AgentCatalogs
    permission_waiters: PermissionWaiters
    environments: Environments
    secret_env: frozenset[str]
    shells: Shells
    snapshots: Snapshots
    reverts: Reverts
    sessions: Sessions
    #: The task tool's subagents (child sessions run by this runtime).
    subagents: Subagents
    transfer: SessionTransfer
    instructions: InstructionEntries
    #: The owner of the MCP server processes (none started until used).
    mcp: McpServers


def build_services(
    config: RuntimeConfig, store: Store, *, host_bus: HostBus | None = None
) -> Services:
    """Make every service of a runtime, in dependency order; nothing is opened here.

    ``host_bus``: how this host reaches the others (over a server database a
    bus of its own, else a private in-process one, when None).
    """
    if config.max_tool_threads < 1 or config.max_blocking_threads < 1:
        raise ValueError("max_tool_threads and max_blocking_threads must be at least 1")
    for pattern in config.secret_env_patterns:
        if not pattern or not set(pattern) & set("*?["):
            raise ValueError(f"secret_env_patterns: {pattern!r} is no glob pattern (* ? [)")
    host_id = config.host_id or default_host_id()
    default_model = config.default_model or SCRIPTED_MODEL
    rescan = asyncio.Event()
    own_bus = None
    if host_bus is None and not config.read_only and is_server_url(config.database_target):
        # Hosts in other processes share the server: reach them through it.
        # After its connection came back, a scan at once: a host that
        # released sessions meanwhile told nobody.
        host_bus = own_bus = NotifyHostBus(config.database_target, on_reconnect=rescan.set)
    host_bus = host_bus or LocalHostBus()

    blocking = BlockingExecutor(limit=config.max_blocking_threads)
    bash = BashTool(
        default_timeout_s=config.bash_timeout_s,
        max_timeout_s=max(config.bash_max_timeout_s, config.bash_timeout_s),
        output_memory_bytes=max(
            config.bash_output_memory_bytes, 2 * config.tool_output_max_bytes + 2
        ),
    )
    bounding = OutputBounding(
        output_dir=config.tool_output_dir,
        max_lines=config.tool_output_max_lines,
        max_bytes=config.tool_output_max_bytes,
        clock=config.clock,
    )
    adapters = build_providers(config.provider_configs)
    providers = ProviderRegistry(
        providers={**adapters, **config.providers},
        models={
            pid: frozenset(c.models)
            for pid, c in config.provider_configs.items()
            if pid not in config.providers
        },
    )
    if config.default_model is not None:
        try:
            providers.check(config.default_model)
        except InvalidRequestError as exc:
            raise ValueError(f"default_model: {exc}") from None
    directories = DirectoryRules(
        data_dir=config.data_dir, allowed=tuple(Path(d) for d in config.allow_directories)
    )
    agents = AgentCatalogs((config.agents_file,), blocking.run)
    waiters = PermissionWaiters()
    secret_env = (
        frozenset(config.secret_env)
        | set(config.secret_env_patterns)
        | {c.api_key_env for c in config.provider_configs.values() if c.api_key_env}
    )
    environments = Environments(secret_env)
    execution = Execution()
    shells = Shells(
        store,
        execution,
        environments,
        bounding,
        blocking.run,
        output_memory_bytes=max(
            config.shell_output_memory_bytes, 2 * config.tool_output_max_bytes + 2
        ),
        timeout_s=config.shell_timeout_s,
        clock=config.clock,
    )
    host_execution = HostExecution(
        store, host_id, host_bus, shells, environments, execution, config.clock
    )
    snapshots = Snapshots(
        config.data_dir / "snapshot", exclude=(config.data_dir,), blocking=blocking.run
    )
    reverts = Reverts(
        store,
        execution,
        snapshots,
        wake=host_execution,
        intents=config.data_dir / "revert",
        blocking=blocking.run,
    )
    sessions = Sessions(
        store,
        wake=host_execution,
        stop=host_execution,
        owners=execution,
        revert=reverts,
        default_directory=config.default_directory,
        blocking=blocking.run,
        directories=directories,
        check_model=providers.check,
        agents=agents,
        waiters=waiters,
    )
    remote_interrupts = RemoteInterrupts(host_id, host_bus, host_execution, clock=config.clock)
    leases = LeaseKeeper(
        store, host_id, ttl_ms=config.lease_ttl_ms, on_lost=host_execution, clock=config.clock
    )
    subagents = Subagents(
        sessions=sessions,
        agents=agents,
        store=store,
        runs=host_execution,
        max_depth=config.subagent_max_depth,
        max_children=config.subagent_max_children,
    )
    builtins = (*builtin_tools(bash=bash), subagents.tool) if config.builtin_tools else ()
    try:
        tools = ToolRegistry((*builtins, *config.tools))
    except ValueError as exc:
        raise ValueError(f"tools: {exc}") from None
    bus = EventBus(store)
    tool_actors = ToolActors(blocking=blocking, limit=config.max_tool_threads)
    mcp = McpServers(
        config.mcp, secret_env=secret_env, idle_s=config.mcp_idle_s, blocking=blocking.run
    )
    builtin_instructions = None
    if not config.instructions:  # as the drain reads it: a source of its own, else these
        builtin_instructions = Instructions(
            store=store,
            data_dir=config.data_dir,
            # OPENCODE_DISABLE_PROJECT_CONFIG (or the SESSIONRT_ twin), read
            # once as the runtime is made, switches it off like the config key.
            discover_project=config.project_instructions
            and not project_config_disabled(os.environ),
            guidance=mcp.guidance if mcp else None,
        )
    drain = Drain(
        store=store,
        sessions=sessions,
        providers=providers,
        tools=tools,
        executor=ToolExecutor(
            tools,
            tool_actors,
            bounding,
            record=_process_recorder(store, leases),
            more=mcp.registry if mcp else None,
        ),
        blocking=blocking,
        bus=bus,
        agents=agents,
        output_dir=config.tool_output_dir,
        instructions=config.instructions or builtin_instructions,
        secret_env=secret_env,
        server_dirs=(config.data_dir,),
        default_model=default_model,
        retry_base_delay_s=config.retry_base_delay_s,
        retry_max_delay_s=config.retry_max_delay_s,
        chat_cache_bytes=config.decode_cache_bytes,
        snapshots=snapshots,
        environments=environments,
        compaction=CompactionSettings(
            auto=config.compaction,
            buffer=config.compaction_buffer,
            tail_tokens=config.compaction_tail_tokens,
        ),
        model_limits=config.limits,
        waiters=waiters,
        nearby=NearbyInstructions(store.queries, blocking.run, enabled=config.project_instructions),
        mcp=mcp if mcp else None,
        clock=config.clock,
    )
    return Services(
        store=store,
        host_id=host_id,
        host_bus=host_bus,
        own_bus=own_bus,
        rescan=rescan,
        execution=execution,
        host_execution=host_execution,
        hooks=DurableHooks(store, drain, leases, host_bus, host_execution),
        drain=drain,
        generator=Generator(
            store=store,
            sessions=sessions,
            providers=providers,
            agents=agents,
            chat=drain.chat_cache,
            default_model=default_model,
        ),
        builtin_instructions=builtin_instructions,
        leases=leases,
        remote_interrupts=remote_interrupts,
        host_message_router=HostMessageRouter(remote_interrupts, host_execution, rescan),
        follows=FollowDispatcher(store),
        bus=bus,
        blocking=blocking,
        tool_actors=tool_actors,
        tools=tools,
        bounding=bounding,
        adapters=adapters,
        providers=providers,
        directories=directories,
        agents=agents,
        permission_waiters=waiters,
        environments=environments,
        secret_env=secret_env,
        shells=shells,
        snapshots=snapshots,
        reverts=reverts,
        sessions=sessions,
        subagents=subagents,
        transfer=SessionTransfer(
            store,
            sessions,
            directories=directories,
            blocking=blocking.run,
            allow_scripts=config.import_scripts,
            leases=leases,
        ),
        instructions=InstructionEntries(store, execution),
        mcp=mcp,
    )
