"""``GET /api/session/{id}/children``: over HTTP, behind the same checks as every route."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient as Client
from http_helpers import create_session


async def test_children_are_listed_oldest_first_and_guarded(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    client = await make_client(password="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    response = await client.post("/api/session", json={}, headers=auth)
    parent = (await response.json())["data"]["id"]
    made = []
    for title in ("first", "second"):
        body: dict[str, Any] = {"parentID": parent, "title": title}
        response = await client.post("/api/session", json=body, headers=auth)
        made.append((await response.json())["data"]["id"])

    url = f"/api/session/{parent}/children"
    unauthorised = await client.get(url)
    assert (unauthorised.status, (await unauthorised.json())["_tag"]) == (
        401,
        "UnauthorizedError",
    )
    response = await client.get(url, headers=auth)
    assert response.status == 200
    children = (await response.json())["data"]
    assert [c["id"] for c in children] == made
    assert {c["parentID"] for c in children} == {parent}

    response = await client.get(f"/api/session/{made[0]}/children", headers=auth)
    assert (await response.json())["data"] == []
    missing = await client.get(
        "/api/session/ses_missing00000000000000000000/children", headers=auth
    )
    assert (missing.status, (await missing.json())["_tag"]) == (404, "SessionNotFoundError")
    bad = await client.get("/api/session/nope/children", headers=auth)
    assert bad.status == 400


async def test_a_page_from_another_origin_may_not_list_children(
    make_client: Callable[..., Awaitable[Client]],
) -> None:
    client = await make_client()
    parent = (await create_session(client))["id"]
    response = await client.get(
        f"/api/session/{parent}/children", headers={"Origin": "https://evil.example"}
    )
    assert response.status == 403
