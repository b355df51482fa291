"""A real MCP server for the tests, written with the official SDK.

    python mcp_server.py stdio
    python mcp_server.py http PORT

Its instructions are the text of the file ``$MCP_TEST_GUIDANCE`` (when set)
at start. It writes ``$MCP_TEST_TOKEN`` to its stderr (the runtime must
redact it) and ``started <pid>`` lines to ``$MCP_TEST_MARKS`` when set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import EmbeddedResource, TextResourceContents


def _mark(line: str) -> None:
    marks = os.environ.get("MCP_TEST_MARKS")
    if marks:
        with open(marks, "a", encoding="utf-8") as f:
            f.write(line + "\n")


guidance_file = os.environ.get("MCP_TEST_GUIDANCE")
instructions = Path(guidance_file).read_text() if guidance_file else None
server = MCPServer("sessionrt-test", instructions=instructions)


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def fail(message: str) -> str:
    """Fail with the message."""
    raise ToolError(message)


@server.tool()
async def slow(ctx: Context) -> str:
    """Wait until cancelled."""
    _mark(f"slow {os.getpid()}")
    await anyio.sleep(3600)
    return "finished"


@server.tool()
async def stuck() -> str:
    """Block the whole server's event loop (it answers nothing any more)."""
    _mark(f"stuck {os.getpid()}")
    import time

    time.sleep(3600)  # noqa: ASYNC251 (blocking on purpose: the server answers nothing)
    return "finished"


@server.tool()
def spawn() -> str:
    """Start a child process that outlives this call (it ignores SIGTERM)."""
    import subprocess

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _mark(f"child {child.pid}")
    return str(child.pid)


@server.tool()
def crash() -> str:
    """Exit in the middle of the call."""
    _mark(f"crash {os.getpid()}")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def picture() -> Image:
    """A one-pixel PNG."""
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
        "0000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
    return Image(data=png, format="png")


@server.tool()
def huge_picture() -> Image:
    """A 6 MiB "image"."""
    return Image(data=b"\x89PNG" + bytes(6 * 1024 * 1024), format="png")


@server.tool()
def document() -> EmbeddedResource:
    """An embedded text resource."""
    return EmbeddedResource(
        type="resource",
        resource=TextResourceContents(
            uri="file:///doc.txt", text="the document", mime_type="text/plain"
        ),
    )


@server.tool()
def lines(count: int) -> str:
    """Many lines of output."""
    return "\n".join(f"line {i}" for i in range(count))


@server.tool()
def whoami(ctx: Context) -> str:
    """Whether the request carried the expected authorization header."""
    headers = ctx.headers or {}
    return (
        "authorized"
        if headers.get("authorization") == os.environ.get("MCP_TEST_AUTH")
        else "anonymous"
    )


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool ``extra`` and announce the changed list."""

    def extra() -> str:
        """A tool that appeared later."""
        return "extra!"

    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    token = os.environ.get("MCP_TEST_TOKEN")
    if token:
        print(f"starting with token {token}", file=sys.stderr, flush=True)
    _mark(f"started {os.getpid()}")
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
