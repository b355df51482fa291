"""The values a tool call is made of: context, result, error, settled outcome.

A call goes ``input`` → :meth:`Tool.run` (on a worker thread, given a
:class:`ToolContext`) → :class:`ToolResult` or :class:`ToolError` → one
:class:`ToolOutcome`, the settled form the drain publishes as
``session.tool.success`` or ``session.tool.failed``.

Errors
------
Every tool failure is a :class:`ToolError`; its ``type`` tag says who ended
the call, and becomes ``error.type`` of the failed outcome::

    ToolError                     base: the tool did not produce a result
      type "aborted"              closed by us: ctx.cancel was set (interrupt,
                                  shutdown) or the runner was closed
      type "timeout"              closed by us: the tool's own deadline passed
      type "invalid-input"        the model's input broke the rules the schema
                                  cannot express (bad regex, empty edit ...)
      type "denied"               the request reaches outside the session's
                                  authority (a path outside its Location, a
                                  write into .sessionrt/ without ``config``)
      type "tool.error"           the default: the environment broke it
                                  (missing file, I/O error, unexpected bug)

The executor adds two tags of its own that no tool raises: ``unknown-tool``
and (for schema violations) ``invalid-input``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import attrs

from actors.tools._process import ProcessGroup

__all__ = [
    "DEFAULT_BASH_TIMEOUT_S",
    "AsyncTool",
    "CancelEvent",
    "Content",
    "SucceededThenInterrupted",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "ToolResult",
    "ToolStatus",
    "text_item",
]

#: One content item: ``{"type": "text", "text": ...}`` or a non-text item such
#: as ``{"type": "file", "mime": ..., "data": <base64>}``, which is kept as is.
Content = Mapping[str, Any]
ToolStatus = Literal["success", "failed"]

DEFAULT_BASH_TIMEOUT_S: Final = 120.0


def text_item(text: str) -> Content:
    """A text content item."""
    return {"type": "text", "text": text}


def _content(items: Iterable[Content]) -> tuple[Content, ...]:
    return tuple(items)


class CancelEvent(threading.Event):
    """A call's stop signal: a ``threading.Event`` that can also wake a selector.

    The call's actor sets it when it hears Cancel (or is stopped). A file loop
    checks :meth:`is_set` per entry; a tool that waits on descriptors (bash
    on its output pipe) selects on :meth:`readable` too, so it wakes the
    moment the call is cancelled rather than at its next poll.
    """

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Lock()
        #: Write ends of the pipes handed out by readable(), still open.
        self._wakers: list[int] = []

    def set(self) -> None:
        with self._guard:
            super().set()
            for fd in self._wakers:
                os.write(fd, b"\0")  # one byte into an empty pipe: never blocks
            self._wakers.clear()

    @contextlib.contextmanager
    def readable(self) -> Iterator[int]:
        """A descriptor that is readable once the event is set; closed on exit."""
        read, write = os.pipe()
        try:
            with self._guard:
                if self.is_set():
                    os.write(write, b"\0")
                else:
                    self._wakers.append(write)
            yield read
        finally:
            # Under the guard: set() never writes to a descriptor closed (or reused) here.
            with self._guard:
                if write in self._wakers:
                    self._wakers.remove(write)
            os.close(read)
            os.close(write)


def _ignore_progress(_update: Mapping[str, Any]) -> None:
    pass


def _unrecorded(_group: ProcessGroup) -> None:
    pass


@attrs.frozen(kw_only=True)
class ToolContext:
    """What a running tool may know about its call and use to report back.

    ``progress`` is called from the worker thread, so whoever builds the
    context supplies a thread-safe function (typically one that hops to the
    loop with ``loop.call_soon_threadsafe``). ``cancel`` is the stop signal the
    call's actor sets when it hears Cancel: long-running tools check it (or
    select on :meth:`CancelEvent.readable`) and raise ``ToolError(type="aborted")``.

    ``spawned`` is called from the worker thread by a tool that starts a process
    group, *before* the group may do anything: it returns once the group is
    durably recorded (so the next start can kill it after a crash), and raises
    :class:`ToolError` when it cannot be, in which case the group must not run.
    """

    session_id: str
    call_id: str
    assistant_message_id: str
    #: The session's Location, absolute. File tools are confined to it.
    directory: Path
    #: The managed tool-output directory; ``tool_…`` files in it are readable.
    output_dir: Path
    cancel: CancelEvent = attrs.field(factory=CancelEvent)
    progress: Callable[[Mapping[str, Any]], None] = _ignore_progress
    spawned: Callable[[ProcessGroup], None] = _unrecorded
    #: bash's default timeout when its tool was not configured with one.
    timeout_s: float = DEFAULT_BASH_TIMEOUT_S
    #: The operator's ``config`` permission: may this call write ``.sessionrt/``?
    config_writes: bool = False
    #: The server's own directories (the data dir): no tool reads, lists or
    #: writes in them, even inside the Location; managed output files excepted.
    server_dirs: tuple[Path, ...] = ()
    #: Names of environment variables a tool's subprocess must not inherit
    #: (beyond the built-in rule of :func:`actors.tools.tool_environment`).
    secret_env: frozenset[str] = frozenset()
    #: The session's own variables (``PUT …/environment``), over the server's
    #: environment without its secrets.
    environment: Mapping[str, str] = attrs.field(factory=dict)
    #: Resolved paths outside the Location this call was granted by the
    #: ``external_directory`` permission (the path, and below it for a directory).
    external: tuple[Path, ...] = ()


@attrs.frozen(kw_only=True)
class ToolResult:
    """What a tool returns: model-visible content items plus metadata.

    ``structured`` is an optional JSON value (the tool's validated structured
    result). Session consumers get it unchanged (``metadata["structured"]`` of
    the settled outcome); the model sees only text, so a structured-only result
    is shown to it as a bounded textual JSON preview (see ``OutputBounding``).
    """

    content: tuple[Content, ...] = attrs.field(converter=_content, default=())
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    structured: Any = None
    #: A managed output file that already holds the *complete* output, which
    #: ``content`` shows only in part (a tool that spilled a large output while
    #: it streamed: bash). Bounding refers to it instead of saving the text.
    saved: Path | None = None
    #: The size of the complete output in ``saved`` (UTF-8 bytes).
    saved_bytes: int = 0

    @classmethod
    def text(cls, text: str, **metadata: Any) -> ToolResult:
        """A result with a single text item."""
        return cls(content=(text_item(text),), metadata=metadata)


class ToolError(Exception):
    """A tool failed; ``type`` tags the failure (see the module docstring)."""

    def __init__(
        self, message: str, *, type: str = "tool.error", metadata: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        #: Kept on the failed outcome (a subagent's session id, say).
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"ToolError({self.message!r}, type={self.type!r})"


class Tool(Protocol):
    """A tool the model can call.

    ``run`` blocks and runs on a worker thread; it may do file I/O and wait on
    subprocesses, must check ``ctx.cancel`` if it can take long, and reports
    failure by raising :class:`ToolError` (any other exception also fails the
    call, as ``tool.error``).
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]:
        """A JSON Schema (an ``object`` schema) the input is validated against."""
        ...

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult: ...


class AsyncTool(Tool, Protocol):
    """A tool whose work is a coroutine (``is_async`` true): the executor awaits
    ``arun`` as a task on the event loop instead of calling ``run`` on a thread.
    It must not block the loop; an interrupt cancels it."""

    @property
    def is_async(self) -> bool: ...

    async def arun(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult: ...


@attrs.frozen(kw_only=True)
class ToolOutcome:
    """A settled tool call: the form published as the call's terminal event."""

    status: ToolStatus
    content: tuple[Content, ...] = attrs.field(converter=_content, default=())
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``{"type": ..., "message": ...}`` when failed, else ``None``.
    error: Mapping[str, Any] | None = None

    @classmethod
    def success(cls, result: ToolResult) -> ToolOutcome:
        metadata = result.metadata
        if result.structured is not None:
            metadata = {**metadata, "structured": result.structured}
        return cls(status="success", content=result.content, metadata=metadata)

    @classmethod
    def failure(
        cls, type: str, message: str, metadata: Mapping[str, Any] | None = None
    ) -> ToolOutcome:
        return cls(
            status="failed", error={"type": type, "message": message}, metadata=metadata or {}
        )

    @classmethod
    def from_error(cls, error: ToolError) -> ToolOutcome:
        return cls.failure(error.type, error.message, error.metadata)


class SucceededThenInterrupted(asyncio.CancelledError):
    """A cancellation that arrived after the tool had already succeeded.

    Raised by :meth:`~actors.tools.ToolExecutor.execute` instead of a bare
    ``CancelledError`` when the interrupt came too late to stop the tool: its
    operation happened and ``outcome`` is its bounded success, which is the
    call's one true settlement. It *is* a ``CancelledError``, so a caller that
    knows nothing of it still sees the cancellation and never swallows it.
    """

    def __init__(self, outcome: ToolOutcome) -> None:
        super().__init__()
        self.outcome = outcome
