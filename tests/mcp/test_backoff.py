"""A crashed server starts again only after its backoff (an injected clock)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mcp_helpers import marked, stdio_server

import actors.mcp._connection as connection_module
from actors.mcp import McpServers, parse_servers
from actors.mcp._connection import McpCallError


@pytest.mark.slow  # four MCP server processes started in turn
async def test_restarts_wait_out_a_doubling_backoff_and_a_success_resets_it(
    tmp_path: Path, marks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "FIRST_BACKOFF_S", 1.0)
    now = [1000.0]
    servers = McpServers(
        parse_servers({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})}),
        clock=lambda: now[0],
    )
    try:
        await servers.tools(str(tmp_path))
        [connection] = servers._connections.values()

        async def crash() -> None:
            with pytest.raises(McpCallError, match="exited with code 3 during the crash call"):
                await connection.call("crash", {})

            assert connection.status == "failed"

        await crash()
        with pytest.raises(McpCallError, match=r"unavailable \(exited with code 3\).* in 1 s"):
            await connection.call("echo", {"text": "too soon"})
        assert len(marked(marks, "started")) == 1
        now[0] += 1.0
        assert (await connection.call("echo", {"text": "a"})).content[0].text == "echo: a"  # type: ignore[union-attr]
        assert len(marked(marks, "started")) == 2

        await crash()  # a success since the last failure: 1 s again
        now[0] += 1.0
        await crash()  # started again, failed again with no success between: 2 s
        now[0] += 1.5
        with pytest.raises(McpCallError, match="unavailable"):
            await connection.call("echo", {"text": "too soon"})
        now[0] += 0.5
        await connection.call("echo", {"text": "b"})
        assert len(marked(marks, "started")) == 4
    finally:
        await servers.aclose()
    assert all(not _alive(pid) for pid in marked(marks, "started"))


def _alive(pid: int) -> bool:
    from mcp_helpers import alive

    return alive(pid)


async def test_concurrent_first_uses_start_one_process(tmp_path: Path, marks: Path) -> None:
    servers = McpServers(parse_servers({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})}))
    try:
        registries = await asyncio.gather(*(servers.tools(str(tmp_path)) for _ in range(5)))
        assert all("files_echo" in r for r in registries)
        assert len(marked(marks, "started")) == 1
    finally:
        await servers.aclose()
