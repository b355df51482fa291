"""MCP guidance as an instruction source, permission rules over MCP tools, secrets."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from http_helpers import create_session, runtime_of
from mcp_helpers import (
    MakeClient,
    by_tool,
    log,
    marked,
    prompt,
    status,
    stdio_server,
    tool,
    until,
    wait_idle,
)

from actors.mcp import parse_servers


def _guidance_updates(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [
        e["data"]  # type: ignore[misc]
        for e in events
        if e["type"] == "session.instructions.updated" and "mcp/files" in e["data"]["delta"]  # type: ignore[index]
    ]


async def test_a_changed_guidance_reaches_the_model_once_as_an_update(
    make_client: MakeClient, tmp_path: Path, marks: Path
) -> None:
    guidance = tmp_path / "guidance.md"
    await asyncio.to_thread(guidance.write_text, "Greet with files_echo.")
    env = {"MCP_TEST_GUIDANCE": str(guidance), "MCP_TEST_MARKS": str(marks)}
    client = await make_client({"files": stdio_server(env=env)})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, "#text one")
    await wait_idle(client, sid)
    [initial] = _guidance_updates(await log(client, sid))
    assert "text" not in initial  # the baseline: rendered into the system text, not a message

    # The server says something else only once it starts again.
    await asyncio.to_thread(guidance.write_text, "Count with files_lines.")
    await prompt(client, sid, "#text two")
    await wait_idle(client, sid)
    assert len(_guidance_updates(await log(client, sid))) == 1
    await prompt(client, sid, tool("files_crash"), "#step", "#text three")
    await wait_idle(client, sid)
    await prompt(client, sid, "#text four")
    await wait_idle(client, sid)
    events = await log(client, sid)
    first, changed = _guidance_updates(events)
    assert first == initial
    assert "The MCP server's guidance changed." in changed["text"]  # type: ignore[operator]
    assert "Count with files_lines." in changed["text"]  # type: ignore[operator]
    assert len(marked(marks, "started")) == 2
    # The model saw it once, as a system message in the session's context.
    response = await client.get(f"/api/session/{sid}/context")
    context = json.dumps((await response.json())["data"])
    assert context.count("Count with files_lines.") == 1


ASKER = """
[agents.asker.permissions]
"files_*" = "ask"
"files_crash" = "deny"
"""


async def test_permission_rules_ask_for_and_hide_mcp_tools(
    make_client: MakeClient, marks: Path
) -> None:
    client = await make_client(
        {"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})}, agents=ASKER
    )
    session = await create_session(client, agent="asker")
    sid = session["id"]
    await prompt(client, sid, tool("files_echo", text="may I"), "#step", tool("files_crash"))

    async def asked() -> bool:
        response = await client.get(f"/api/session/{sid}/permission")
        return bool((await response.json())["data"])

    await until(asked)
    [pending] = (await (await client.get(f"/api/session/{sid}/permission")).json())["data"]
    assert pending["tool"] == "files_echo"
    assert pending["permission"] == "files_echo"
    reply = await client.post(
        f"/api/session/{sid}/permission/{pending['id']}", json={"reply": "once"}
    )
    assert reply.status == 204
    await wait_idle(client, sid)
    calls = by_tool(await log(client, sid))
    assert calls["files_echo"][0]["content"] == [{"type": "text", "text": "echo: may I"}]
    [denied] = calls["files_crash"]
    assert denied["error"]["type"] == "permission.denied"
    assert denied["executed"] is False
    assert marked(marks, "crash") == []

    # Denied tools are not offered; asked ones are.
    runtime = runtime_of(client)
    agent = await runtime.agents.agent(session["location"]["directory"], "asker")
    rules = agent.permissions
    registry = runtime.mcp.registry(session["location"]["directory"])
    offered = {spec.name for spec in registry.offered_specs(rules)}
    assert "files_echo" in offered
    assert "files_crash" not in offered


SECRET = "tok-very-secret-4711"


async def test_a_secret_in_env_reaches_no_event_log_line_or_status(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await make_client({"files": stdio_server(env={"MCP_TEST_TOKEN": SECRET})})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_echo", text="hi"), "#step", tool("files_crash"))
    await wait_idle(client, sid)
    runtime = runtime_of(client)

    async def stderr_seen() -> bool:
        return any("starting with token" in line for line in runtime.mcp.stderr("files"))

    await until(stderr_seen)
    events = json.dumps(await log(client, sid))
    assert "echo: hi" in events
    assert SECRET not in events
    assert SECRET not in json.dumps(await status(client))
    assert "starting with token [redacted]" in runtime.mcp.stderr("files")
    assert any("starting with token [redacted]" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if SECRET in r.getMessage()]
    assert SECRET not in repr(parse_servers({"files": stdio_server(env={"T": SECRET})}))
