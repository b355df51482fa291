"""Helpers for tests that talk HTTP to a real server."""

from __future__ import annotations

from typing import Any

from aiohttp import web
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
