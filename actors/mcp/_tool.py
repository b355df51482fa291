"""McpTool: one server tool as a :class:`~actors.tools.Tool`, named ``<server>_<tool>``.

The call runs like any tool's (a child actor's thread, the executor's
validation, bounding, durable records); its thread hands the request to the
loop that owns the connection and waits, polling ``ctx.cancel``: an
interrupt cancels the request there.

Results: text items stay text; an image or audio item becomes a ``file``
item (mime and base64 data, as the read tool gives images); an embedded
resource becomes text (its text) or a ``file`` item (its blob); a resource
link becomes a text line. ``structuredContent`` is the result's structured
value. A result with ``isError`` fails the call with its text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from actors.tools._types import Content, ToolContext, ToolError, ToolResult, text_item

if TYPE_CHECKING:
    import mcp_types as types

    from actors.mcp._connection import Connection

__all__ = ["McpTool", "tool_name"]

#: A larger image, audio or blob item is not passed on (a text note says so),
#: as the read tool refuses images over the same size.
MAX_BINARY_BYTES: Final = 5 * 1024 * 1024
#: How often a waiting call looks at its cancel flag.
POLL_S: Final = 0.05
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]+")
#: Providers accept tool names up to 64 characters.
MAX_NAME: Final = 64


def tool_name(server: str, tool: str) -> str:
    """``<server>_<tool>``, with what providers refuse in a name replaced by ``_``."""
    return _UNSAFE.sub("_", f"{server}_{tool}")[:MAX_NAME]


class McpTool:
    """A server's tool, bound to the connection that serves it."""

    def __init__(
        self,
        connection: Connection,
        tool: types.Tool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._connection = connection
        self._remote = tool.name
        self._loop = loop
        self.name = tool_name(connection.config.name, tool.name)
        described = tool.description or tool.title or ""
        self.description = f"{described}\n\n(MCP server {connection.config.name})".strip()
        schema = dict(tool.input_schema or {})
        schema.setdefault("type", "object")
        self.input_schema: Mapping[str, Any] = schema

    def __repr__(self) -> str:
        return f"<McpTool {self.name}>"

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        future = asyncio.run_coroutine_threadsafe(
            self._connection.call(self._remote, input), self._loop
        )
        while True:
            try:
                result = future.result(POLL_S)
                break
            except concurrent.futures.TimeoutError:
                if ctx.cancel.is_set():
                    future.cancel()
                    raise ToolError(
                        f"Tool execution aborted: {self.name}", type="aborted"
                    ) from None
            except concurrent.futures.CancelledError:
                raise ToolError(f"Tool execution aborted: {self.name}", type="aborted") from None
            except Exception as exc:
                message = getattr(exc, "message", None) or str(exc)
                raise ToolError(message, type=getattr(exc, "type", "tool.error")) from None
        content = tuple(_content(item) for item in result.content)
        if result.is_error:
            text = "\n".join(str(c["text"]) for c in content if c.get("type") == "text")
            raise ToolError(text or f"{self.name} failed", type="tool.error")
        return ToolResult(
            content=content,
            structured=result.structured_content,
            metadata={"mcp": {"server": self._connection.config.name, "tool": self._remote}},
        )


def _binary(mime: str, data: str, **extra: str) -> Content:
    size = len(data) * 3 // 4  # base64: the decoded size, near enough
    if size > MAX_BINARY_BYTES:
        return text_item(
            f"[{mime} content of about {size} bytes left out: over the"
            f" {MAX_BINARY_BYTES // (1024 * 1024)} MiB limit]"
        )
    return {"type": "file", "mime": mime, "data": data, **extra}


def _content(item: Any) -> Content:
    kind = getattr(item, "type", None)
    if kind == "text":
        return text_item(item.text)
    if kind in ("image", "audio"):
        return _binary(item.mime_type, item.data)
    if kind == "resource":
        resource = item.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text_item(text)
        return _binary(
            resource.mime_type or "application/octet-stream", resource.blob, uri=str(resource.uri)
        )
    if kind == "resource_link":
        return text_item(f"[resource] {item.uri}" + (f" ({item.name})" if item.name else ""))
    return text_item(f"[unsupported MCP content: {kind}]")
