"""Helpers of the MCP tests (tests/mcp): the test server, waits, reads of the log and status."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from http_helpers import Client, collect_until_synced

SERVER = Path(__file__).parent / "mcp" / "mcp_server.py"
#: A guard on waits for something to happen, never the assertion.
GUARD_S = 30.0
MakeClient = Callable[..., Awaitable[Client]]


def stdio_server(**extra: Any) -> dict[str, Any]:
    return {"command": [sys.executable, str(SERVER), "stdio"], **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + GUARD_S
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the MCP test server never listened on {port}")
        time.sleep(0.05)


async def until(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Wait until ``predicate`` holds (a guard, not an assertion)."""
    async with asyncio.timeout(GUARD_S):
        while True:
            if await predicate():
                return
            await asyncio.sleep(0.02)


async def prompt(client: Client, sid: str, *lines: str) -> None:
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": "\n".join(lines)})
    assert response.status == 200, await response.text()


def tool(name: str, **input: Any) -> str:
    return f"#tool {name} {json.dumps(input)}"


async def wait_idle(client: Client, sid: str) -> None:
    response = await client.post(f"/api/experimental/session/{sid}/wait")
    assert response.status == 204, await response.text()


async def log(client: Client, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/api/experimental/session/{sid}/log")
    assert response.status == 200
    return [
        f["data"] for f in await collect_until_synced(response) if f.get("event") != "log.synced"
    ]


async def status(client: Client) -> list[dict[str, Any]]:
    response = await client.get("/api/mcp")
    assert response.status == 200, await response.text()
    data: list[dict[str, Any]] = (await response.json())["data"]
    return data


async def until_status(client: Client, wanted: str, index: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def check() -> bool:
        nonlocal found
        found = (await status(client))[index]
        return bool(found["status"] == wanted)

    await until(check)
    return found


def marked(marks: Path, word: str) -> list[int]:
    """The pids the server marked with ``word``."""
    if not marks.exists():
        return []
    return [
        int(line.split()[1]) for line in marks.read_text().splitlines() if line.split()[0] == word
    ]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a reaper that may never come is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def terminals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] in ("session.tool.success", "session.tool.failed")]


def _call(event: dict[str, Any]) -> tuple[str, str]:
    # Call ids are per step: the assistant message tells two steps' call_0_0 apart.
    return event["data"]["assistantMessageID"], event["data"]["id"]


def by_tool(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each tool's terminals' data, by the called tool's name."""
    names = {_call(e): e["data"]["name"] for e in events if e["type"] == "session.tool.called"}
    out: dict[str, list[dict[str, Any]]] = {}
    for e in terminals(events):
        out.setdefault(names[_call(e)], []).append({"type": e["type"], **e["data"]})
    return out
