"""MCP tools over stdio, end to end: a real server process, a real sessionrt server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from http_helpers import create_session, runtime_of
from mcp_helpers import (
    MakeClient,
    alive,
    log,
    marked,
    prompt,
    status,
    stdio_server,
    tool,
    wait_idle,
)


def _terminals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] in ("session.tool.success", "session.tool.failed")]


async def test_tools_are_listed_offered_with_their_schema_and_called(
    make_client: MakeClient, marks: Path
) -> None:
    client = await make_client({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})})
    assert (await status(client))[0]["status"] == "idle"  # started on first use only
    assert marked(marks, "started") == []
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_echo", text="hi"), "#step", "#text done")
    await wait_idle(client, sid)
    events = await log(client, sid)
    [called] = [e for e in events if e["type"] == "session.tool.called"]
    assert called["data"]["name"] == "files_echo"
    [success] = _terminals(events)
    assert success["type"] == "session.tool.success"
    assert success["data"]["content"] == [{"type": "text", "text": "echo: hi"}]
    assert events[-1]["type"] == "session.execution.succeeded"

    [entry] = await status(client)
    assert entry["name"] == "files"
    assert entry["transport"] == "stdio"
    assert entry["status"] == "connected"
    assert {"files_echo", "files_fail", "files_slow", "files_crash"} <= set(entry["tools"])
    directory = str(Path(entry["locations"][0]["directory"]))
    registry = runtime_of(client).mcp.registry(directory)
    [spec] = [s for s in registry.specs() if s.name == "files_echo"]
    assert spec.input_schema["properties"]["text"]["type"] == "string"
    assert spec.input_schema["required"] == ["text"]
    assert "Say the text back." in spec.description
    assert len(marked(marks, "started")) == 1  # one process for the Location


async def test_a_tool_error_and_a_schema_violation_fail_the_call(make_client: MakeClient) -> None:
    client = await make_client({"files": stdio_server()})
    sid = (await create_session(client))["id"]
    await prompt(
        client,
        sid,
        tool("files_fail", message="the disk is on fire"),
        tool("files_echo", wrong=1),
        "#step",
        "#text done",
    )
    await wait_idle(client, sid)
    failed = {e["data"]["id"]: e["data"] for e in _terminals(await log(client, sid))}
    errors = sorted((f["error"]["type"], f["error"]["message"]) for f in failed.values())
    assert errors[0] == ("invalid-input", errors[0][1])
    assert "files_echo" in errors[0][1]
    assert errors[1][0] == "tool.error"
    assert errors[1][1].endswith("the disk is on fire")


async def test_images_resources_and_long_output_are_bounded_like_any_tool(
    make_client: MakeClient,
) -> None:
    client = await make_client({"files": stdio_server()}, tool_output_max_lines=100)
    sid = (await create_session(client))["id"]
    await prompt(
        client,
        sid,
        tool("files_picture"),
        tool("files_document"),
        tool("files_huge_picture"),
        tool("files_lines", count=5000),
        "#step",
        "#text done",
    )
    await wait_idle(client, sid)
    events = await log(client, sid)
    names = {
        e["data"]["id"]: e["data"]["name"] for e in events if e["type"] == "session.tool.called"
    }
    by_name = {names[e["data"]["id"]]: e["data"] for e in _terminals(events)}
    [picture] = by_name["files_picture"]["content"]
    assert picture["type"] == "file"
    assert picture["mime"] == "image/png"
    assert picture["data"].startswith("iVBORw0KGgo")
    assert by_name["files_document"]["content"] == [{"type": "text", "text": "the document"}]
    [huge] = by_name["files_huge_picture"]["content"]
    assert huge["type"] == "text"
    assert huge["text"].startswith("[image/png content of about 6291")
    assert "over the 5 MiB limit" in huge["text"]
    lines = by_name["files_lines"]
    assert lines["metadata"]["truncated"] is True
    saved = Path(lines["metadata"]["outputPath"])
    assert (await asyncio.to_thread(saved.read_text)).count(
        "\n"
    ) == 4999  # the whole output, kept in a managed file
    assert len(lines["content"][0]["text"].splitlines()) < 200


async def test_shutdown_ends_the_server_process_group(make_client: MakeClient, marks: Path) -> None:
    client = await make_client({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_spawn"))
    await wait_idle(client, sid)
    [pid] = marked(marks, "started")
    [child] = marked(marks, "child")
    assert alive(pid)
    assert alive(child)
    await client.close()
    assert not alive(pid)
    assert not alive(child)  # its whole process group, a child ignoring SIGTERM too


async def test_an_idle_server_is_ended_and_started_again_on_next_use(
    make_client: MakeClient, marks: Path
) -> None:
    client = await make_client({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_echo", text="x"))
    await wait_idle(client, sid)
    [pid] = marked(marks, "started")
    servers = runtime_of(client).mcp
    assert await servers.reap(now=0.0) == 0  # used just now: kept
    assert await servers.reap(now=float("inf")) == 1
    assert not alive(pid)
    assert (await status(client))[0]["status"] == "idle"
    await prompt(client, sid, tool("files_echo", text="again"))
    await wait_idle(client, sid)
    assert len(marked(marks, "started")) == 2
