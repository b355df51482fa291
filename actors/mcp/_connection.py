"""One MCP server for one Location: its process (or HTTP session), owned here.

This is the only module that imports the MCP SDK; :mod:`actors.mcp._servers`
imports it when the first server starts, so a runtime with no ``[mcp.*]``
table never loads the SDK.

Lifecycle (:class:`Connection`)::

    idle ──ready()──> starting ──initialize + tools/list──> connected
                         │                                    │ exit, kill, crash
                         └──────── failed (error) <───────────┘
                                   │ next use after the backoff
                                   └──> starting …

- Started on first use (:meth:`Connection.ready`), by one task that owns the
  transport and the SDK's ``ClientSession`` (both are entered and left in
  that task, as anyio requires).
- A stdio server runs in its own process group (``start_new_session``),
  in the session's Location, with the server's environment less its secrets
  plus the configured ``env``. Its stderr is kept (the last
  :data:`STDERR_LINES` lines, each cut at :data:`STDERR_LINE_CHARS`) and
  logged, with every configured secret value replaced, never sent to a
  session.
- A server that exits, or is killed because it did not answer, is
  ``failed``; the call that was running fails with an error saying so and is
  never sent again. The next use after a backoff (1 s, doubled per failure
  up to :data:`MAX_BACKOFF_S`, reset by a successful call) starts it anew.
- A call that times out kills a stdio server's process group (it did not
  answer); an interrupted call is cancelled (``notifications/cancelled``),
  then the server must answer a ping within :data:`PROBE_S`, or its group is
  killed.
- ``notifications/tools/list_changed`` marks the list stale; the next
  :meth:`Connection.refresh` (the next step) lists again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from actors.mcp._config import McpServerConfig

__all__ = ["Connection", "McpCallError", "Status"]

log = logging.getLogger("sessionrt.mcp")

Status = Literal["idle", "starting", "connected", "failed"]

#: The longest JSON-RPC line a stdio server may send (a larger one ends it).
MAX_LINE_BYTES: Final = 32 * 1024 * 1024
STDERR_LINES: Final = 200
STDERR_LINE_CHARS: Final = 2000
FIRST_BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 60.0
#: The longest a server may take to answer initialize (and its first tools/list),
#: unless its ``timeout_ms`` is longer: starting a process takes a while.
INIT_TIMEOUT_S: Final = 10.0
#: After an interrupted call, the server must answer a ping within this long.
PROBE_S: Final = 5.0
#: After its stdin closes, a stdio server has this long to exit, then SIGTERM,
#: then as long again before SIGKILL (to its whole process group).
EXIT_GRACE_S: Final = 2.0


class McpCallError(Exception):
    """A call that did not reach a result; ``type`` is the tool error's tag."""

    def __init__(self, message: str, *, type: str = "tool.error") -> None:
        super().__init__(message)
        self.message = message
        self.type = type


class Connection:
    """One configured server for one Location (see the module docstring)."""

    def __init__(
        self,
        config: McpServerConfig,
        directory: Path,
        *,
        environment: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.directory = directory
        self._environment = dict(environment)
        self._clock = clock
        self.status: Status = "idle"
        self.error: str | None = None
        #: The last listed tools and initialize's instructions (kept while failed).
        self.tools: tuple[types.Tool, ...] = ()
        self.instructions: str | None = None
        #: Bumped whenever ``tools`` changes (a registry is rebuilt then).
        self.generation = 0
        self.in_flight = 0
        self.last_used = clock()
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stale = False
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._pgid: int | None = None
        #: Why the current process ended, when we know (exit code, a kill).
        self._ended: str | None = None
        self._retry_at = 0.0
        self._backoff = FIRST_BACKOFF_S
        self._probes: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<Connection {self.config.name} {self.directory} {self.status}>"

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or self.status == "starting"

    def redact(self, text: str) -> str:
        for secret in self.config.secrets:
            text = text.replace(secret, "[redacted]")
        return text

    # -- starting and stopping -------------------------------------------------

    async def ready(self) -> ClientSession:
        """The initialized session; starts the server on first use.

        Raises:
            McpCallError: the server failed (now, or before and its backoff
                has not passed).
        """
        if self._session is not None and self.status == "connected" and not self._wake.is_set():
            return self._session
        if self._closing:
            raise McpCallError(f"MCP server {self.config.name!r} is shutting down", type="aborted")
        task = self._task
        if self._starting is None and task is not None and not task.done():
            # The last process is still being ended: its end decides what is next.
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        if self._starting is None:
            if self.status == "failed" and self._clock() < self._retry_at:
                wait = self._retry_at - self._clock()
                raise McpCallError(
                    f"MCP server {self.config.name!r} is unavailable ({self.error});"
                    f" it is started again in {wait:.0f} s"
                )
            self._start()
        assert self._starting is not None
        await asyncio.shield(self._starting)
        if self._session is None or self.status != "connected":
            raise McpCallError(f"MCP server {self.config.name!r} is unavailable ({self.error})")
        return self._session

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self.status = "starting"
        self._wake = asyncio.Event()
        self._ended = None
        self._starting = loop.create_future()
        self._task = loop.create_task(self._run(), name=f"mcp:{self.config.name}")

    def _started(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.set_result(None)
        self._starting = None

    async def _run(self) -> None:
        timeout = max(self.config.timeout_ms / 1000, INIT_TIMEOUT_S)
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                try:
                    with anyio.fail_after(timeout):
                        init = await session.initialize()
                        tools = await _list_tools(session)
                except TimeoutError:
                    self.kill(f"did not answer initialize within {timeout:g} s")
                    raise McpCallError(self._ended or "no answer") from None
                self.instructions = init.instructions or None
                self._set_tools(tools)
                self._session = session
                self.status = "connected"
                self.error = None
                self._started()
                await self._wake.wait()
        except Exception as exc:
            self._ended = self._ended or _describe(exc, self)
        finally:
            self._session = None
            for probe in list(self._probes):
                probe.cancel()
            if self._closing:
                self.status = "idle"
            else:
                self._fail(self._ended or "the connection ended")
            self._started()

    def _fail(self, reason: str) -> None:
        """This process (or HTTP session) failed: the next start waits out the backoff.

        Booked once per process, by whoever sees the failure first (the call
        that was running, or the owner task as it ends).
        """
        if self.status == "failed":
            return
        self.status, self.error = "failed", reason
        self._retry_at = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        log.warning("MCP server %s (%s) failed: %s", self.config.name, self.directory, reason)

    def kill(self, reason: str) -> None:
        """End the server now: its process group is killed (stdio), the connection closed."""
        self._ended = self._ended or reason
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pgid, signal.SIGKILL)
        self._wake.set()

    async def aclose(self) -> None:
        """Stop the server (idle or shutdown); waits until its process is gone."""
        self._closing = True
        self._wake.set()
        task = self._task
        if task is not None:
            # The owner task ends itself (every wait in it is bounded); a
            # cancellation of the caller is not swallowed.
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        self._task = None

    # -- the transports --------------------------------------------------------

    def _transport(
        self,
    ) -> contextlib.AbstractAsyncContextManager[tuple[Any, Any]]:
        if self.config.command:
            return self._stdio()
        return self._http()

    @contextlib.asynccontextmanager
    async def _http(self) -> AsyncIterator[tuple[Any, Any]]:
        assert self.config.url is not None
        async with (
            create_mcp_http_client(headers=dict(self.config.headers)) as client,
            streamable_http_client(self.config.url, http_client=client) as (read, write),
        ):
            yield read, write

    @contextlib.asynccontextmanager
    async def _stdio(self) -> AsyncIterator[tuple[Any, Any]]:
        env = {**self._environment, **self.config.env}
        try:
            process = await asyncio.create_subprocess_exec(
                *self.config.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self.directory,
                start_new_session=True,
                limit=MAX_LINE_BYTES,
            )
        except OSError as exc:
            raise McpCallError(f"cannot start {self.config.command[0]!r}: {exc.strerror}") from None
        self._pgid = process.pid
        incoming: tuple[
            MemoryObjectSendStream[SessionMessage | Exception],
            MemoryObjectReceiveStream[SessionMessage | Exception],
        ] = anyio.create_memory_object_stream(0)
        outgoing: tuple[
            MemoryObjectSendStream[SessionMessage], MemoryObjectReceiveStream[SessionMessage]
        ] = anyio.create_memory_object_stream(0)
        tasks = [
            asyncio.create_task(self._read_stdout(process, incoming[0])),
            asyncio.create_task(self._write_stdin(process, outgoing[1])),
            asyncio.create_task(self._read_stderr(process)),
        ]
        try:
            yield incoming[1], outgoing[0]
        finally:
            await self._stop_process(process)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for stream in (*incoming, *outgoing):
                stream.close()
            self._pgid = None

    async def _read_stdout(
        self,
        process: asyncio.subprocess.Process,
        sink: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        assert process.stdout is not None
        try:
            async with sink:
                while True:
                    try:
                        line = await process.stdout.readline()
                    except ValueError:  # a line over the limit
                        self.kill(f"sent a message over {MAX_LINE_BYTES} bytes")
                        return
                    if not line:
                        break
                    if not line.strip():
                        continue
                    try:
                        message: SessionMessage | Exception = SessionMessage(
                            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        )
                    except ValueError as exc:
                        message = exc
                    await sink.send(message)
                # End of output: the process is gone (or closed its stdout).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(EXIT_GRACE_S):
                        await process.wait()
                if not self._closing and self._ended is None:
                    code = process.returncode
                    self._ended = (
                        "exited" if code is None else f"exited with code {_exit_code(code)}"
                    )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self._wake.set()

    async def _write_stdin(
        self, process: asyncio.subprocess.Process, source: MemoryObjectReceiveStream[SessionMessage]
    ) -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, ConnectionError, OSError):
            async with source:
                async for message in source:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    process.stdin.write(data.encode() + b"\n")
                    await process.stdin.drain()

    async def _read_stderr(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        name = self.config.name
        while True:
            try:
                raw = await process.stderr.readline()
            except ValueError:  # an endless line: take what is there
                raw = await process.stderr.read(STDERR_LINE_CHARS)
            if not raw:
                return
            text = raw.decode("utf-8", "replace").rstrip("\n")[:STDERR_LINE_CHARS]
            line = self.redact(text)
            self.stderr.append(line)
            log.info("mcp %s: %s", name, line)

    async def _stop_process(self, process: asyncio.subprocess.Process) -> None:
        if process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EXIT_GRACE_S):
                    await process.wait()
            if process.returncode is not None:
                break
        # The group may outlive its leader: nothing of it stays.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    # -- what the session says -------------------------------------------------

    async def _on_message(self, message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._stale = True

    def _set_tools(self, tools: tuple[types.Tool, ...]) -> None:
        if tools != self.tools or self.generation == 0:
            self.tools = tools
            self.generation += 1
        self._stale = False

    async def refresh(self) -> None:
        """Start the server if it is due; list its tools again after ``list_changed``."""
        try:
            session = await self.ready()
        except McpCallError:
            return
        if not self._stale:
            return
        self._stale = False
        try:
            with anyio.fail_after(self.config.timeout_ms / 1000):
                self._set_tools(await _list_tools(session))
        except (TimeoutError, MCPError) as exc:
            self._stale = True
            log.warning("MCP server %s: tools/list failed: %s", self.config.name, exc)

    # -- calls -----------------------------------------------------------------

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> types.CallToolResult:
        """Call ``tool``; its result (``is_error`` included).

        Raises:
            McpCallError: no result (unavailable, timed out, the server ended).
            asyncio.CancelledError: the call was interrupted (the request is
                cancelled; a server that then does not answer a ping is killed).
        """
        session = await self.ready()
        timeout = self.config.timeout_ms / 1000
        self.in_flight += 1
        self.last_used = self._clock()
        try:
            with anyio.fail_after(timeout):
                result = await session.call_tool(tool, dict(arguments))
        except TimeoutError:
            what = f"did not answer {tool} within {timeout:g} s"
            if self.config.command:
                self.kill(what)
                what += "; its process group was killed"
            raise McpCallError(f"MCP server {self.config.name!r} {what}", type="timeout") from None
        except asyncio.CancelledError:
            self._probe(session)
            raise
        except (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            if self._ended is not None or self._wake.is_set():
                self._fail(self._ended or "the connection ended")
                raise McpCallError(
                    f"MCP server {self.config.name!r} {self._ended or 'ended'} during the"
                    f" {tool} call; the call was not retried"
                ) from None
            message = exc.error.message if isinstance(exc, MCPError) else "connection closed"
            if not isinstance(exc, MCPError) or exc.code == types.CONNECTION_CLOSED:
                # The transport is gone (an HTTP server that went away): the
                # connection ends, and the next use connects again.
                lost = f"lost the connection ({message})"
                self.kill(lost)
                self._fail(lost)
                raise McpCallError(
                    f"MCP server {self.config.name!r} {lost} during the {tool} call;"
                    " the call was not retried"
                ) from None
            raise McpCallError(f"MCP server {self.config.name!r}: {self.redact(message)}") from None
        finally:
            self.in_flight -= 1
            self.last_used = self._clock()
        if not isinstance(result, types.CallToolResult):
            raise McpCallError(f"MCP server {self.config.name!r} answered {tool} with no result")
        if not result.is_error:
            self._backoff = FIRST_BACKOFF_S
        return result

    def _probe(self, session: ClientSession) -> None:
        """After an interrupted call: the server must still answer, or it is killed."""

        async def probe() -> None:
            try:
                with anyio.fail_after(PROBE_S):
                    await session.send_ping()
            except TimeoutError:
                self.kill(f"did not answer within {PROBE_S:g} s after a cancelled call")
            except Exception:
                pass

        task = asyncio.get_running_loop().create_task(probe(), name=f"mcp-probe:{self.config.name}")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)


async def _list_tools(session: ClientSession) -> tuple[types.Tool, ...]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # pages, bounded
        params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
        listed = await session.list_tools(params=params)
        tools.extend(listed.tools)
        cursor = listed.next_cursor
        if not cursor:
            break
    return tuple(tools)


def _exit_code(code: int) -> str:
    return f"{code} (signal {-code})" if code < 0 else str(code)


def _describe(exc: BaseException, connection: Connection) -> str:
    if isinstance(exc, McpCallError):
        return exc.message
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e, connection) for e in exc.exceptions)
    if isinstance(exc, MCPError):
        return connection.redact(exc.error.message)
    text = connection.redact(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
