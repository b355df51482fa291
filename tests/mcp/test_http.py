"""MCP tools over streamable HTTP: the same test server, listening on loopback."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from http_helpers import Client, create_session
from mcp_helpers import (
    MakeClient,
    by_tool,
    log,
    marked,
    prompt,
    status,
    tool,
    until,
    wait_idle,
)

TOKEN = "Bearer http-secret-0815"


async def test_http_tools_are_called_with_the_configured_headers(
    make_client: MakeClient, http_server: Callable[..., str]
) -> None:
    url = http_server(MCP_TEST_AUTH=TOKEN)
    client = await make_client({"docs": {"url": url, "headers": {"authorization": TOKEN}}})
    sid = (await create_session(client))["id"]
    await prompt(
        client,
        sid,
        tool("docs_whoami"),
        tool("docs_echo", text="over http"),
        tool("docs_fail", message="no such page"),
        "#step",
        "#text done",
    )
    await wait_idle(client, sid)
    events = await log(client, sid)
    calls = by_tool(events)
    assert calls["docs_whoami"][0]["content"] == [{"type": "text", "text": "authorized"}]
    assert calls["docs_echo"][0]["content"] == [{"type": "text", "text": "echo: over http"}]
    [failed] = calls["docs_fail"]
    assert failed["error"]["type"] == "tool.error"
    assert failed["error"]["message"].endswith("no such page")
    [entry] = await status(client)
    assert entry["transport"] == "http"
    assert entry["status"] == "connected"
    assert "docs_whoami" in entry["tools"]
    assert "http-secret-0815" not in json.dumps(events) + json.dumps(entry)


async def _interrupt(client: Client, sid: str) -> None:
    response = await client.post(f"/api/session/{sid}/interrupt")
    assert response.status == 200


async def test_http_slow_call_is_interrupted_and_a_gone_server_fails_clearly(
    make_client: MakeClient, http_server: Callable[..., str], marks: Path
) -> None:
    url = http_server()
    client = await make_client({"docs": {"url": url}})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("docs_slow"), "#step", "#text never")

    async def slow() -> bool:
        return bool(marked(marks, "slow"))

    await until(slow)
    await _interrupt(client, sid)
    await wait_idle(client, sid)
    [aborted] = by_tool(await log(client, sid))["docs_slow"]
    assert aborted["error"]["type"] == "aborted"

    # The server goes away: the next call fails with an error that says so.
    [pid] = marked(marks, "started")
    os.killpg(pid, signal.SIGKILL)
    await prompt(client, sid, tool("docs_echo", text="anyone?"))
    await wait_idle(client, sid)
    [gone] = by_tool(await log(client, sid))["docs_echo"]
    assert gone["type"] == "session.tool.failed"
    # The session's connection may see the server gone during the call, or before
    # it (its stream ends first, and the call then finds it unavailable): either
    # way the message says which server and what happened, never a bare error.
    assert gone["error"]["message"] in (
        "MCP server 'docs' lost the connection (Connection closed) during the echo call;"
        " the call was not retried",
        "MCP server 'docs' is unavailable (ConnectError: All connection attempts failed)",
    )
    entry = (await status(client))[0]
    assert entry["status"] == "failed"
    # Lost, or (tried again at the next step, no backoff here) refused.
    assert "lost the connection" in entry["error"] or "ConnectError" in entry["error"]
