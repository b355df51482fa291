"""Helpers for tests that talk HTTP to a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from server.app import RUNTIME

Client = TestClient[web.Request, web.Application]


async def create_session(client: Client, **body: Any) -> dict[str, Any]:
    response = await client.post("/api/session", json=body)
    assert response.status == 200, await response.text()
    data: dict[str, Any] = (await response.json())["data"]
    return data


def runtime_of(client: Client) -> Any:
    return client.app[RUNTIME]  # type: ignore[index]


async def frames(response: ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Parse SSE frames: {'id', 'event', 'data'} or {'comment'}."""
    current: dict[str, Any] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if current:
                yield current
            current = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(": ")
            current[key] = int(value) if key == "id" else value
            if key == "data":
                current["data"] = orjson.loads(value)


async def collect_until_synced(response: ClientResponse) -> list[dict[str, Any]]:
    out = []
    async for f in frames(response):
        out.append(f)
        if f.get("event") == "log.synced":
            break
    return out
