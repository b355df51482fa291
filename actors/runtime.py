"""The runtime: the store, the session facade, execution, models and tools, wired.

    async with Runtime(RuntimeConfig(data_dir=path)) as rt:
        session = await rt.sessions.create()
        await rt.sessions.prompt(session.id, PromptInput(text="hello"))
        await rt.execution.wait_idle(session.id)

This is what the HTTP server and the embedded host hold. Closing it interrupts
running executions with reason ``shutdown`` (their claims stay, so the next
start can recover them), lets running tools settle or fail, stops the
sweeper, the tool threads and the store, in that order. The interrupt reaches
every session at once, and each running tool kills its process group on it,
so shutdown waits for the slowest kill, not for the sum of them.

Several hosts may share one log (:mod:`storage.lease`): this runtime is one
host, ``host_id``. An execution's start takes the session's lease, its drains
append under its fence, the keeper renews it every ``lease_ttl_ms / 4`` and
the terminal releases it. A wake for a session another host holds reaches
that host over the :class:`~actors.host_messages.HostBus` (so do a resume and an
interrupt); a periodic scan recovers claimed sessions whose lease expired;
closing releases this host's leases (the shutdown terminal) and tells the
other hosts, which take the sessions at once.

Every process group a tool starts is recorded (``session.tool.spawned``)
before it may run anything; the startup sweep kills what a crash left behind
before failing those calls as stale (:mod:`actors.reaper`). Deleting a session
interrupts its execution first.

``RuntimeConfig(read_only=True)`` is for commands that only read (``sessionrt
sessions``, ``sessionrt log``): the store opens read-only, and nothing runs,
recovers, or writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import attrs

from actors.host_messages import HostBus
from actors.llm import (
    ModelLimits,
    Provider,
    ProviderConfig,
)
from actors.mcp import McpServerConfig
from actors.recovery import DEFAULT_MAX_ATTEMPTS, RecoveryReport, recover
from actors.services import build_services, terminal_of
from actors.session import Terminal
from actors.session.compaction import BUFFER_TOKENS, TAIL_TOKENS
from actors.session.drain import InstructionSource
from actors.session.shells import DEFAULT_TIMEOUT_S as SHELL_TIMEOUT_S
from actors.session.shells import MAX_OUTPUT_BYTES as SHELL_OUTPUT_MEMORY_BYTES
from actors.subagents import DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DEPTH
from actors.supervisor import Execution
from actors.tools import (
    DEFAULT_BASH_TIMEOUT_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_LINES,
    Tool,
    run_sweeper,
)
from actors.tools.builtin import (
    DEFAULT_MAX_TIMEOUT_S,
    DEFAULT_OUTPUT_MEMORY_BYTES,
)
from protocol.errors import InvalidRequestError, ServiceUnavailableError
from protocol.lifecycle import Lifecycle, LifecycleState
from protocol.shapes import ModelRef
from storage import (
    RecordedEvent,
    StorageError,
    Store,
    Synchronous,
    connect,
    redact,
)
from storage.clock import SYSTEM, Clock, wait_event

__all__ = ["DB_NAME", "Runtime", "RuntimeConfig", "check_data_dir", "make_data_dir"]

DB_NAME = "sessionrt.sqlite"

log = logging.getLogger(__name__)


def _absolute_dir(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(path))


def _absolute_or_none(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def _absolute_all(paths: Sequence[str]) -> tuple[str, ...]:
    return tuple(os.path.abspath(p) for p in paths)


def _tool_tuple(tools: Iterable[Tool]) -> tuple[Tool, ...]:
    return tuple(tools)


def _absolute_database(target: str | None) -> str | None:
    if target is None or "://" in target:
        return target  # a URL (an unknown scheme is refused, unechoed, by storage.connect)
    return os.path.abspath(target)


@attrs.frozen(kw_only=True)
class RuntimeConfig:
    """The runtime's settings. Every path is made absolute here, against the
    working directory at start: a relative one would otherwise be resolved
    again by each child process (git resolves a relative store against the
    work tree, which silently turned snapshots off)."""

    #: The data directory: the SQLite log, ``agents.toml``, ``AGENTS.md``,
    #: snapshots and tool-output files.
    data_dir: Path = attrs.field(converter=_absolute_dir)
    #: SQLite's ``synchronous`` pragma: ``FULL`` (an admitted input survives a
    #: power loss) or ``NORMAL`` (it survives a crash of the process).
    synchronous: Synchronous = "FULL"
    #: Where sessions created without a location live (default: the cwd).
    default_directory: str | None = attrs.field(default=None, converter=_absolute_or_none)
    #: Directories a session may live in although the rules refuse them
    #: (``/``, the data directory): see :mod:`actors.files.locations`.
    allow_directories: tuple[str, ...] = attrs.field(default=(), converter=_absolute_all)
    #: Environment variables no tool subprocess inherits, besides the built-in
    #: rule (password, ``*_API_KEY``, ``*TOKEN*`` …): see ``actors.tools.tool_environment``.
    secret_env: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: Glob patterns (case-insensitive) of more variables no tool inherits
    #: (``[runtime] secret_env_patterns = ["VAULT_*"]``).
    secret_env_patterns: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: At most this many tool calls run at once, each on one of at most this
    #: many pooled pykka call actors (two threads each: the actor's and its
    #: worker's, started when first needed and joined at shutdown); more wait
    #: for a slot (``actors.tools.ToolActors``).
    max_tool_threads: int = 16
    #: Threads of the plain executor for blocking helpers that are not tool
    #: calls: catalogue reads, attachments, makedirs, the output sweep.
    max_blocking_threads: int = 4
    #: bash: the timeout of a call that names none; then its process group is killed.
    bash_timeout_s: float = DEFAULT_BASH_TIMEOUT_S
    #: bash: the most a call may ask for with ``timeout_s`` (a larger ask is clamped).
    bash_max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S
    #: bash: output kept in memory per call while it streams; beyond it the
    #: complete output goes to a managed tool-output file (head and tail kept).
    bash_output_memory_bytes: int = DEFAULT_OUTPUT_MEMORY_BYTES
    #: A user shell command's output kept in memory; beyond it, a managed file.
    shell_output_memory_bytes: int = SHELL_OUTPUT_MEMORY_BYTES
    #: A user shell command still running after this long is ended (its
    #: process group killed; its entry ``failed`` with reason ``timeout``).
    shell_timeout_s: float = SHELL_TIMEOUT_S
    #: A tool result longer than this many lines is cut to a preview; the whole
    #: output goes to a managed tool-output file the preview points at.
    tool_output_max_lines: int = DEFAULT_MAX_LINES
    #: The same cut by bytes.
    tool_output_max_bytes: int = DEFAULT_MAX_BYTES
    #: Extra model providers by provider id; the scripted model is always there.
    providers: Mapping[str, Provider] = attrs.field(factory=dict)
    #: Real models over HTTP (``[providers.*]``); the runtime owns their clients.
    provider_configs: Mapping[str, ProviderConfig] = attrs.field(factory=dict)
    #: The model of a session whose session and agent name none (``[runtime]
    #: default_model``); the scripted model when None.
    default_model: ModelRef | None = None
    #: The embedding application's tools (``actors.tools.tool``), offered
    #: alongside the built-in ones under the same rules; a name taken twice
    #: or a bad schema fails the start.
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tool_tuple)
    # metadata "file" False: a setting for embedding, not a key of a configuration
    # file (server.config reads the keys a file may set from these fields).
    #: Offer the built-in tools (read, write, edit, list, glob, grep, bash, task).
    builtin_tools: bool = attrs.field(default=True, metadata={"file": False})
    #: ``task`` subagents nest at most this deep (``[runtime] subagent_max_depth``).
    subagent_max_depth: int = DEFAULT_MAX_DEPTH
    #: Tasks one session runs at once (``[runtime] subagent_max_children``).
    subagent_max_children: int = DEFAULT_MAX_CHILDREN
    #: MCP servers by name (``[mcp.<name>]``, :mod:`actors.mcp`); their tools
    #: join the offered ones as ``<server>_<tool>``.
    mcp: Mapping[str, McpServerConfig] = attrs.field(factory=dict)
    #: An MCP server unused this long is ended (started again on next use).
    mcp_idle_s: float = 600.0
    #: Instruction admission; the built-in sources (:mod:`actors.instructions`) when None.
    instructions: InstructionSource | None = None
    #: Discover the project's AGENTS.md / CLAUDE.md files (``[runtime]
    #: project_instructions``); the data dir's AGENTS.md is read either way.
    #: ``OPENCODE_DISABLE_PROJECT_CONFIG=1`` (or ``SESSIONRT_…``) also turns it off.
    project_instructions: bool = True
    #: Keep ``metadata.script`` of an imported session (``[runtime]
    #: import_scripts``). Off: a script makes the scripted model run its
    #: directives (tool calls, bash), so importing someone's export would run
    #: their code; the script is dropped.
    import_scripts: bool = False
    #: Run the startup sweep (resume claimed sessions) before accepting work.
    recover: bool = True
    #: Only read: the store opens read-only, no sweep, no execution (every
    #: operation that would write or run fails).
    read_only: bool = attrs.field(default=False, metadata={"file": False})
    #: Restarts of one claimed execution (counted durably) before recovery
    #: fails it instead of resuming it again.
    max_resume_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: This host's id as a lease owner (``[runtime] host_id``); None: a fresh
    #: random one per start (a restarted process is a new host).
    host_id: str | None = None
    #: How long an execution lease lives unrenewed (``[runtime] lease_ttl_ms``):
    #: the longest a dead host's sessions wait before another host takes them.
    lease_ttl_ms: int = 10_000
    #: The first retry's backoff, doubled for each later one (jittered; reference §4.6).
    retry_base_delay_s: float = 2.0
    #: The longest a provider's retry-after may make a retry wait.
    retry_max_delay_s: float = 15 * 60.0
    #: Bytes each decode cache may hold (the store's decoded messages, the
    #: drain's converted chat history): least recently used evicted first.
    decode_cache_bytes: int = 32 * 1024 * 1024
    #: The event log's database (``[runtime] database``): a SQLite file path, or a
    #: ``postgresql://`` URL; None is ``sessionrt.sqlite`` in the data dir.
    #: Shown redacted: a password in the URL never reaches a repr or a log.
    database: str | None = attrs.field(
        default=None,
        converter=_absolute_database,
        repr=lambda value: repr(None if value is None else redact(value)),
    )
    #: Automatic compaction (``[runtime] compaction``); an agent's
    #: ``compaction`` overrides it. Manual compaction works either way.
    compaction: bool = True
    #: Reserved headroom in tokens: a step compacts first once its estimate
    #: reaches ``context - max(min(output, 32000), compaction_buffer)``.
    compaction_buffer: int = BUFFER_TOKENS
    #: Token budget of the recent tail a compaction keeps verbatim.
    compaction_tail_tokens: int = TAIL_TOKENS
    #: Window limits of models no ``[providers.*]`` table describes (the
    #: scripted model, injected providers), keyed ``PROVIDER/MODEL``.
    model_limits: Mapping[str, ModelLimits] = attrs.field(factory=dict)
    #: What every wait of the runtime is measured on (lease expiry and renewal,
    #: retry backoff, the output sweep, interrupt answers, stream heartbeats):
    #: the real clock; tests give one they advance (:mod:`storage.clock`).
    clock: Clock = attrs.field(default=SYSTEM, eq=False, repr=False)

    def limits(self, model: ModelRef) -> ModelLimits | None:
        """The context and output limits of ``model``; None when unknown."""
        given = self.model_limits.get(f"{model.provider_id}/{model.id}")
        if given is not None:
            return given
        provider = self.provider_configs.get(model.provider_id)
        return None if provider is None else provider.models.get(model.id)

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_NAME

    @property
    def database_target(self) -> str:
        """What :func:`storage.connect` opens: ``database``, else the data dir's SQLite file."""
        return os.fspath(self.db_path) if self.database is None else self.database

    @property
    def agents_file(self) -> Path:
        return self.data_dir / "agents.toml"

    @property
    def tool_output_dir(self) -> Path:
        return self.data_dir / "tool-output"


def check_data_dir(path: Path) -> None:
    """Refuse a data dir that is (or would lie under) a regular file, in a sentence.

    Blocking (it stats the path and its parents). ``os.makedirs`` would say
    "[Errno 17] File exists", which names neither the setting nor the file.
    """
    for existing in (path, *path.parents):
        if not existing.exists():
            continue
        if existing == path and not path.is_dir():
            raise InvalidRequestError(
                f"the data directory {path} exists and is not a directory",
                field="runtime.data_dir",
            )
        if not existing.is_dir():
            raise InvalidRequestError(
                f"the data directory {path} cannot be made: {existing} is a file",
                field="runtime.data_dir",
            )
        return


def make_data_dir(path: Path) -> None:
    """Create the data dir (and its parents) unless it exists; blocking."""
    check_data_dir(path)
    os.makedirs(path, exist_ok=True)


class Runtime:
    def __init__(
        self,
        config: RuntimeConfig,
        *,
        store: Store | None = None,
        host_bus: HostBus | None = None,
    ) -> None:
        """``store``: an open store shared with other runtimes (hosts), owned by
        the caller; ``host_bus``: how this host reaches the others (a private
        in-process bus when None)."""
        self.config = config
        self._lifecycle = Lifecycle("runtime")
        self._stack = contextlib.AsyncExitStack()
        self._own_store = store is None
        if store is None:
            store = connect(
                config.database_target,
                synchronous=config.synchronous,
                read_only=config.read_only,
                decode_cache_bytes=config.decode_cache_bytes,
                clock=config.clock,
            )
        self.services = services = build_services(config, store, host_bus=host_bus)
        # The services the server, the embedded host and the tests reach most,
        # under their own names; the rest are ``services.<name>``.
        self.store = services.store
        self.host_id = services.host_id
        self.leases = services.leases
        self.bus = services.bus
        self.blocking = services.blocking
        self.agents = services.agents
        self.shells = services.shells
        self.reverts = services.reverts
        self.sessions = services.sessions
        self.transfer = services.transfer
        self.instructions = services.instructions
        #: The owner of the MCP server processes (none started until used).
        self.mcp = services.mcp
        self.recovery = RecoveryReport()

    @property
    def execution(self) -> Execution:
        """The session actors; ServiceUnavailableError unless the runtime runs."""
        return self.services.host_execution.execution

    async def _owner(self, session_id: str) -> str | None:
        """The other host holding a live lease on the session, if any."""
        for lease in await self.store.queries.leases(live_at=self.config.clock.now_ms()):
            if lease.session_id == session_id and lease.host_id != self.host_id:
                return lease.host_id
        return None

    async def active(self) -> dict[str, tuple[str, int | None]]:
        """Sessions running now on any host: session id -> (host id, lease epoch)."""
        local = await self.execution.active()
        out: dict[str, tuple[str, int | None]] = {}
        claimed = {c.session_id for c in await self.store.queries.claims()}
        mine: dict[str, int] = {}
        for lease in await self.store.queries.leases(live_at=self.config.clock.now_ms()):
            if lease.host_id == self.host_id:
                mine[lease.session_id] = lease.epoch
            elif lease.session_id in claimed:
                out[lease.session_id] = (lease.host_id, lease.epoch)
        for sid in local:
            # No epoch yet while the busy period's start is still taking the lease.
            fence = self.leases.fence(sid)
            out[sid] = (self.host_id, mine.get(sid) if fence is None else fence.epoch)
        return out

    async def wait_idle(self, session_id: str) -> None:
        """Return once no host runs the session (this one's successors included)."""
        await self.execution.wait_idle(session_id)
        ended = asyncio.Event()

        def watch(records: Sequence[RecordedEvent]) -> None:
            if any(r.aggregate_id == session_id and terminal_of(r.event) for r in records):
                ended.set()

        unsubscribe = self.store.subscribe(watch)
        try:
            # Another host's live lease ends with its terminal, or at its expiry
            # (a host that died): re-read at least every quarter ttl.
            while await self._owner(session_id) is not None:
                await wait_event(self.config.clock, ended, self.config.lease_ttl_ms / 4000)
                ended.clear()
        finally:
            unsubscribe()

    async def resume(self, session_id: str) -> Terminal:
        """Start or join the session's execution, here or on the host that holds it."""
        return await self.services.host_execution.resume(session_id)

    async def stop_child(self, session_id: str) -> None:
        """A subagent's session stops with its parent's call (see HostExecution)."""
        await self.services.host_execution.stop_child(session_id)

    async def __aenter__(self) -> Self:
        self._lifecycle.open()
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _open(self) -> None:
        services, config, stack = self.services, self.config, self._stack
        for adapter in services.adapters.values():
            # Closed after everything that could still stream from them.
            stack.push_async_callback(adapter.aclose)
        await stack.enter_async_context(services.blocking)
        await stack.enter_async_context(services.tool_actors)
        if not config.read_only:
            await services.blocking.run(make_data_dir, config.data_dir)
        if config.default_directory is not None and not config.read_only:
            # A misconfigured default fails the start, not every later create.
            await services.blocking.run(
                functools.partial(services.directories.check, field="runtime.default_directory"),
                config.default_directory,
            )
        await self._open_store()
        # Subscribed to the store since build_services: it stops forwarding here.
        stack.callback(services.bus.close)
        if config.read_only:
            return
        if services.builtin_instructions is not None:
            services.builtin_instructions.open()
            # Closed after execution stops (the stack unwinds in reverse).
            stack.callback(services.builtin_instructions.close)
        # Ended after execution stops (pushed before it): no call is running then.
        stack.push_async_callback(services.mcp.aclose)
        sweeper = asyncio.get_running_loop().create_task(
            run_sweeper(services.bounding, services.blocking, config.clock),
            name="tool-output-sweeper",
        )
        stack.push_async_callback(_cancel, sweeper)
        # Closed after execution stops (pushed first): the steps use the watches.
        stack.push_async_callback(services.snapshots.aclose)
        if services.own_bus is not None:
            # Closed last: the shutdown's hand-over notice goes out through it.
            await services.own_bus.open()
            stack.push_async_callback(services.own_bus.close)
        # After execution stopped and the leases ended, right before the bus
        # closes: the wakes admitted here while closing go to the others.
        stack.push_async_callback(services.host_execution.hand_over_wakes, self.sessions.inbox.gate)
        # Renewal ends after execution stops (the terminals release the leases).
        await services.leases.start()
        stack.push_async_callback(services.leases.aclose)
        await services.host_execution.start(services.hooks)
        stack.push_async_callback(services.host_execution.stop)
        stack.callback(
            await services.host_bus.subscribe(self.host_id, services.host_message_router)
        )
        # Closed before execution stops: a shutdown kills running shells,
        # whose entries stay running until the next start cancels them.
        stack.push_async_callback(services.shells.aclose)
        if config.recover:
            await services.shells.recover()
            await services.reverts.recover()
            self.recovery = await self.recover()
            scan = asyncio.get_running_loop().create_task(self._scan(), name="lease-scan")
            stack.push_async_callback(_cancel, scan)

    async def _open_store(self) -> None:
        if self._own_store:
            await self._stack.enter_async_context(self.store)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._lifecycle.close() is LifecycleState.CLOSED:
            return
        await self._stack.aclose()

    async def recover(self) -> RecoveryReport:
        """Run the recovery sweep now (it also runs at start and then periodically)."""
        # Imports a dead process left half written go first: nothing resumes them.
        await self.transfer.discard_abandoned()
        return await recover(
            self.store,
            self.sessions,
            self.execution,
            self.blocking,
            self.leases,
            max_attempts=self.config.max_resume_attempts,
        )

    async def _scan(self) -> None:
        """Recover claimed sessions whose lease expired (or that another host released)."""
        # At most a second: a dead host's sessions move within expiry + 1 s.
        interval = min(self.config.lease_ttl_ms / 2 / 1000, 1.0)
        while True:
            # A timeout, not wait_for: on 3.11, wait_for returns normally when the
            # event and a cancellation land together, and the scan then ran on
            # forever, holding a closing runtime open.
            await wait_event(self.config.clock, self.services.rescan, interval)
            self.services.rescan.clear()
            try:
                await self.recover()
            except ServiceUnavailableError:
                return  # execution stopped: the runtime is closing
            except StorageError as exc:
                # The database away for now: the message is the news (the next
                # period tries again), a traceback is noise.
                log.warning("the lease scan failed: %s", exc)
            except Exception:
                log.exception("the lease scan failed")

    async def interrupt(self, session_id: str, *, resume: bool = False) -> bool:
        """Interrupt the session's execution as the user, on whichever host runs it
        (:mod:`actors.session.interrupts`); never deletes input. True when one stopped.

        With ``resume``, the session is woken again at steer scope when any
        steer is pending (queued prompts stay parked): one behind a queued
        control item gets it delivered first (the drain's idle boundary).
        """
        await self.sessions.get(session_id)
        interrupted = await self.execution.interrupt(session_id, "user")
        # Its subagents still running here stop too (those its interrupted task
        # calls ran have already: a call settles after its child stopped).
        interrupted = await self._interrupt_descendants(session_id) or interrupted
        # The user's shells of the session end too (their entries say so).
        interrupted = await self.shells.stop([session_id], "interrupted") > 0 or interrupted
        if not interrupted:
            owner = await self._owner(session_id)
            if owner is not None:
                interrupted = await self.services.remote_interrupts.send(owner, session_id)
        if resume:
            pending = await self.sessions.pending(session_id)
            if any(item.delivery == "steer" for item in pending):
                self.execution.wake(session_id, "steer")
        return interrupted

    async def _interrupt_descendants(self, session_id: str) -> bool:
        active = set(await self.execution.active())
        if not active:
            return False
        stopped = False
        frontier = list(await self.store.queries.children(session_id))
        seen: set[str] = set()
        while frontier:
            child = frontier.pop()
            if child in seen:
                continue
            seen.add(child)
            if child in active:
                stopped = await self.execution.interrupt(child, "user") or stopped
            frontier.extend(await self.store.queries.children(child))
        return stopped


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
