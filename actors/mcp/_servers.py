"""McpServers: the owner of every MCP server connection of a runtime.

One :class:`~actors.mcp._connection.Connection` per configuration and
Location, made on first use (a step in that Location lists tools or reads
guidance), ended when idle for ``idle_s`` (:meth:`McpServers.reap`, run
every quarter of it) and at shutdown (:meth:`McpServers.aclose`). How many
exist is bounded by the configured servers times the Locations used within
``idle_s``, and by :data:`MAX_CONNECTIONS` (beyond it, the least recently
used idle one is ended first).

For a step (:meth:`McpServers.tools`) the servers of the session's
Location are started (concurrently) and their tools gathered into a
:class:`~actors.tools.ToolRegistry` of their own, rebuilt only when a
server's list changed; the executor finds a call's tool there
(:meth:`McpServers.registry`) when the built-in registry has no such name.

The MCP SDK is imported when the first connection is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from actors.files.confine import PROJECT_CONFIG_DIR
from actors.mcp._config import McpServerConfig, narrow_servers
from actors.mcp._tool import McpTool, tool_name
from actors.tools._environment import tool_environment
from actors.tools._registry import ToolRegistry

if TYPE_CHECKING:
    from actors.mcp._connection import Connection

__all__ = ["GUIDANCE_PREFIX", "MAX_CONNECTIONS", "PROJECT_FILE", "McpServers"]

log = logging.getLogger("sessionrt.mcp")

#: Instruction keys of server guidance: ``mcp/<server>``.
GUIDANCE_PREFIX: Final = "mcp/"
PROJECT_FILE: Final = Path(PROJECT_CONFIG_DIR) / "mcp.toml"
MAX_CONNECTIONS: Final = 256
DEFAULT_IDLE_S: Final = 600.0

Blocking = Callable[[Callable[[], Any]], Awaitable[Any]]


async def _inline(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


class McpServers:
    def __init__(
        self,
        configs: Mapping[str, McpServerConfig],
        *,
        secret_env: Iterable[str] = (),
        idle_s: float = DEFAULT_IDLE_S,
        blocking: Blocking = _inline,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.configs = dict(configs)
        if any(c.enabled for c in self.configs.values()) and find_spec("mcp") is None:
            # Said at start, not at the first step that would use a server.
            raise ValueError(
                "[mcp.*] servers are configured but the MCP SDK is not installed:"
                " pip install 'sessionrt[mcp]'"
            )
        self._secret_env = tuple(secret_env)
        self.idle_s = idle_s
        self._blocking = blocking
        self._clock = clock
        self._connections: dict[tuple[Any, str], Connection] = {}
        #: Per Location: the generations the registry was built from, and it
        #: (at most :data:`MAX_CONNECTIONS` Locations; emptied when full).
        self._registries: dict[str, tuple[tuple[Any, ...], ToolRegistry]] = {}
        #: Per Location: the project's narrowing error, if its file is broken
        #: (bounded like the registries).
        self._project_errors: dict[str, str] = {}
        self._reaper: asyncio.Task[None] | None = None
        #: Connections being ended after an eviction.
        self._ending: set[asyncio.Task[None]] = set()
        self._closed = False

    def __bool__(self) -> bool:
        return bool(self.configs)

    # -- per Location ----------------------------------------------------------

    async def _configs_for(self, directory: str) -> list[McpServerConfig]:
        """The enabled servers of ``directory``, as its project's file narrows them."""
        if not any(c.enabled for c in self.configs.values()):
            return []
        path = Path(directory) / PROJECT_FILE
        try:
            raw = await self._blocking(lambda: _read_project(path))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            self._project_error(directory, f"{PROJECT_FILE}: {exc}")
            return []
        configs = self.configs
        if raw is not None:
            try:
                configs = narrow_servers(self.configs, raw.get("mcp", {}))
            except ValueError as exc:
                self._project_error(directory, f"{PROJECT_FILE}: {exc}")
                return []
        self._project_errors.pop(directory, None)
        return [c for c in configs.values() if c.enabled]

    def _project_error(self, directory: str, error: str) -> None:
        if directory not in self._project_errors:
            log.warning("MCP servers are off in %s: %s", directory, error)
        if len(self._project_errors) >= MAX_CONNECTIONS:
            self._project_errors.clear()
        self._project_errors[directory] = error

    def _connection(self, config: McpServerConfig, directory: str) -> Connection:
        key = (config.key(), directory)
        found = self._connections.get(key)
        if found is not None:
            return found
        # The SDK is imported here, with the first server used.
        from actors.mcp._connection import Connection

        if len(self._connections) >= MAX_CONNECTIONS:
            self._evict()
        found = Connection(
            config,
            Path(directory),
            environment=tool_environment(secret_env=self._secret_env),
            clock=self._clock,
        )
        self._connections[key] = found
        self._ensure_reaper()
        return found

    async def _ready(self, directory: str) -> list[Connection]:
        if self._closed:
            return []
        connections = [self._connection(c, directory) for c in await self._configs_for(directory)]
        # Concurrently: a slow server does not hold up the others' start.
        await asyncio.gather(*(c.refresh() for c in connections))
        return connections

    async def tools(self, directory: str) -> ToolRegistry:
        """The MCP tools of ``directory``'s servers now (starting them on first use)."""
        connections = await self._ready(directory)
        generations = tuple((id(c), c.generation) for c in connections)
        kept = self._registries.get(directory)
        if kept is not None and kept[0] == generations:
            return kept[1]
        registry = ToolRegistry()
        loop = asyncio.get_running_loop()
        for connection in connections:
            for tool in connection.tools:
                mcp_tool = McpTool(connection, tool, loop)
                try:
                    registry.register(mcp_tool)
                except ValueError as exc:
                    log.warning("MCP server %s: tool skipped: %s", connection.config.name, exc)
        if len(self._registries) >= MAX_CONNECTIONS:
            # Locations that came and went (by count): rebuilt on their next step.
            self._registries.clear()
        self._registries[directory] = (generations, registry)
        return registry

    def registry(self, directory: Path | str) -> ToolRegistry | None:
        """The registry :meth:`tools` last built for ``directory`` (a call's lookup)."""
        kept = self._registries.get(str(directory))
        return None if kept is None else kept[1]

    async def guidance(self, directory: str) -> dict[str, str]:
        """Each server's ``instructions`` (from initialize), keyed ``mcp/<server>``.

        A server that failed keeps the guidance it last gave (unchanged, so
        nothing is announced); one that never connected gives none.
        """
        out: dict[str, str] = {}
        for connection in await self._ready(directory):
            if connection.instructions:
                out[GUIDANCE_PREFIX + connection.config.name.lower()] = connection.instructions
        return out

    # -- ownership -------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if self._reaper is None and not self._closed:
            self._reaper = asyncio.get_running_loop().create_task(
                self._reap_forever(), name="mcp-reaper"
            )

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(max(self.idle_s / 4, 0.05))
            await self.reap()

    async def reap(self, now: float | None = None) -> int:
        """End connections unused for ``idle_s``; how many were ended."""
        now = self._clock() if now is None else now
        idle = [
            (key, c)
            for key, c in self._connections.items()
            if not c.busy and c.status != "idle" and now - c.last_used >= self.idle_s
        ]
        for key, connection in idle:
            self._connections.pop(key, None)
            self._registries.pop(str(connection.directory), None)
        await asyncio.gather(*(c.aclose() for _, c in idle))
        return len(idle)

    def _evict(self) -> None:
        candidates = [(c.last_used, key) for key, c in self._connections.items() if not c.busy]
        if not candidates:
            return
        _, key = min(candidates)
        connection = self._connections.pop(key)
        self._registries.pop(str(connection.directory), None)
        # Owned here: shutdown waits for it like for every other connection.
        task = asyncio.get_running_loop().create_task(connection.aclose())
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def aclose(self) -> None:
        """End every server (shutdown): each process group is gone when this returns."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        connections = list(self._connections.values())
        self._connections.clear()
        self._registries.clear()
        await asyncio.gather(*(c.aclose() for c in connections), *self._ending)

    # -- status ----------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Every configured server: its status, error and tool names (``GET /api/mcp``)."""
        out: list[dict[str, Any]] = []
        for name, config in sorted(self.configs.items()):
            mine = [c for c in self._connections.values() if c.config.name == name]
            entry: dict[str, Any] = {"name": name, "transport": config.transport}
            if not config.enabled:
                entry["status"] = "disabled"
            elif any(c.status == "connected" for c in mine):
                entry["status"] = "connected"
            elif any(c.status == "failed" for c in mine):
                entry["status"] = "failed"
                entry["error"] = next(c.error for c in mine if c.status == "failed")
            elif any(c.status == "starting" for c in mine):
                entry["status"] = "starting"
            else:
                entry["status"] = "idle"
            names = {tool_name(name, t.name) for c in mine for t in c.tools}
            entry["tools"] = sorted(names)
            entry["locations"] = [
                {
                    "directory": str(c.directory),
                    "status": c.status,
                    **({"error": c.error} if c.error and c.status == "failed" else {}),
                }
                for c in mine
            ]
            out.append(entry)
        return out

    def stderr(self, name: str) -> list[str]:
        """The kept stderr lines (redacted) of server ``name``'s processes."""
        return [
            line for c in self._connections.values() if c.config.name == name for line in c.stderr
        ]


def _read_project(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    if os.path.getsize(path) > 1024 * 1024:
        raise OSError("the file is over 1 MiB")
    return tomllib.loads(text)
