"""MCP servers that misbehave: slow, stuck, crashing, silent at initialize."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from http_helpers import Client, create_session
from mcp_helpers import (
    MakeClient,
    alive,
    by_tool,
    log,
    marked,
    prompt,
    status,
    stdio_server,
    tool,
    until,
    until_status,
    wait_idle,
)

import actors.mcp._connection as connection_module


async def _interrupt(client: Client, sid: str) -> None:
    response = await client.post(f"/api/session/{sid}/interrupt")
    assert response.status == 200, await response.text()


async def _marked(marks: Path, word: str) -> int:
    async def seen() -> bool:
        return bool(marked(marks, word))

    await until(seen)
    return marked(marks, word)[-1]


async def _dead(pid: int) -> None:
    async def gone() -> bool:
        return not alive(pid)

    await until(gone)


async def test_an_interrupt_cancels_a_slow_call_and_the_server_stays(
    make_client: MakeClient, marks: Path
) -> None:
    client = await make_client({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_slow"), "#step", "#text never")
    pid = await _marked(marks, "slow")
    await _interrupt(client, sid)
    await wait_idle(client, sid)
    events = await log(client, sid)
    [failed] = by_tool(events)["files_slow"]
    assert failed["type"] == "session.tool.failed"
    assert failed["error"]["type"] == "aborted"
    assert not [e for e in events if e["type"] == "session.text.ended"]
    # The server answered after the cancel: it is the same process, still serving.
    await prompt(client, sid, tool("files_echo", text="after"))
    await wait_idle(client, sid)
    [ok] = by_tool(await log(client, sid))["files_echo"]
    assert ok["content"] == [{"type": "text", "text": "echo: after"}]
    assert marked(marks, "started") == [pid]
    assert alive(pid)


async def test_a_server_that_does_not_answer_after_an_interrupt_is_killed(
    make_client: MakeClient, marks: Path
) -> None:
    client = await make_client({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_stuck"))
    pid = await _marked(marks, "stuck")
    await _interrupt(client, sid)
    await wait_idle(client, sid)
    [failed] = by_tool(await log(client, sid))["files_stuck"]
    assert failed["error"]["type"] == "aborted"
    await _dead(pid)  # the probe went unanswered: its process group was killed
    entry = await until_status(client, "failed")
    assert "did not answer" in entry["error"]
    # The next use starts it again (after the backoff, none here).
    await prompt(client, sid, tool("files_echo", text="again"))
    await wait_idle(client, sid)
    [ok] = by_tool(await log(client, sid))["files_echo"]
    assert ok["type"] == "session.tool.success"
    assert len(marked(marks, "started")) == 2


async def test_a_call_past_its_timeout_fails_and_the_silent_server_is_killed(
    make_client: MakeClient, marks: Path
) -> None:
    server = stdio_server(env={"MCP_TEST_MARKS": str(marks)}, timeout_ms=1000)
    client = await make_client({"files": server})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_stuck"), "#step", "#text carried on")
    await wait_idle(client, sid)
    events = await log(client, sid)
    [failed] = by_tool(events)["files_stuck"]
    assert failed["error"]["type"] == "timeout"
    assert "did not answer stuck within 1 s" in failed["error"]["message"]
    await _dead(marked(marks, "stuck")[0])
    texts = [e["data"]["text"] for e in events if e["type"] == "session.text.ended"]
    assert texts == ["carried on"]


async def test_a_crash_mid_call_fails_that_call_once_and_the_server_restarts(
    make_client: MakeClient, marks: Path
) -> None:
    client = await make_client({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_crash"), "#step", tool("files_echo", text="back"))
    await wait_idle(client, sid)
    events = await log(client, sid)
    [crashed] = by_tool(events)["files_crash"]
    assert crashed["type"] == "session.tool.failed"
    assert crashed["error"]["type"] == "tool.error"
    message = crashed["error"]["message"]
    assert "exited with code 3 during the crash call" in message
    assert "not retried" in message
    # Never replayed: one call recorded, one run by the server.
    assert [e["data"]["name"] for e in events if e["type"] == "session.tool.called"] == [
        "files_crash",
        "files_echo",
    ]
    assert len(marked(marks, "crash")) == 1
    [echo] = by_tool(events)["files_echo"]
    assert echo["content"] == [{"type": "text", "text": "echo: back"}]
    first, second = marked(marks, "started")
    assert first != second
    assert not alive(first)


async def test_a_server_that_never_answers_initialize_fails_and_the_session_goes_on(
    make_client: MakeClient, marks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "INIT_TIMEOUT_S", 0.5)
    silent = (
        "import os, sys\n"
        f"open({str(marks)!r}, 'a').write(f'started {{os.getpid()}}\\n')\n"
        "sys.stdin.read()\n"
    )
    client = await make_client(
        {"mute": {"command": [sys.executable, "-c", silent], "timeout_ms": 500}}
    )
    sid = (await create_session(client))["id"]
    await prompt(client, sid, "#text still here")
    await wait_idle(client, sid)
    events = await log(client, sid)
    assert events[-1]["type"] == "session.execution.succeeded"
    [entry] = await status(client)
    assert entry["status"] == "failed"
    assert "did not answer initialize within 0.5 s" in entry["error"]
    assert entry["tools"] == []
    started = marked(marks, "started")
    assert started  # each start was ended (one per use: no backoff here)
    for pid in started:
        await _dead(pid)


async def test_list_changed_offers_the_new_tool_at_the_next_step(make_client: MakeClient) -> None:
    client = await make_client({"files": stdio_server()})
    sid = (await create_session(client))["id"]
    await prompt(client, sid, tool("files_grow"), "#step", tool("files_extra"), "#step", "#text ok")
    await wait_idle(client, sid)
    calls = by_tool(await log(client, sid))
    assert calls["files_grow"][0]["type"] == "session.tool.success"
    [extra] = calls["files_extra"]
    assert extra["type"] == "session.tool.success", extra
    assert extra["content"] == [{"type": "text", "text": "extra!"}]
    assert "files_extra" in (await status(client))[0]["tools"]
