"""``DELETE /api/session/{id}/shell/{shellID}`` over HTTP: guarded, tagged, confined."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from http_helpers import Client, runtime_of

MakeClient = Callable[..., Awaitable[Client]]
AUTH = {"Authorization": "Bearer hunter2"}


async def _tag(response: Any) -> tuple[int, str]:
    return response.status, (await response.json())["_tag"]


async def _session(client: Client) -> str:
    response = await client.post("/api/session", json={}, headers=AUTH)
    assert response.status == 200, await response.text()
    sid: str = (await response.json())["data"]["id"]
    return sid


async def test_the_cancel_route_is_behind_the_guards_and_ends_only_its_own_shell(
    make_client: MakeClient,
) -> None:
    client = await make_client(password="hunter2")
    sid, other = await _session(client), await _session(client)
    started = await client.post(
        f"/api/session/{sid}/shell",
        json={"command": "sleep 100000", "id": "msg_routed"},
        headers=AUTH,
    )
    assert started.status == 204
    shells = runtime_of(client).shells
    url = f"/api/session/{sid}/shell/msg_routed"
    # Refused before authentication, and without it: the shell runs on.
    evil = {**AUTH, "Origin": "http://evil.example"}
    assert await _tag(await client.delete(url, headers=evil)) == (403, "ForbiddenError")
    assert await _tag(await client.delete(url, headers={**AUTH, "Host": "evil.example"})) == (
        421,
        "MisdirectedRequestError",
    )
    assert await _tag(await client.delete(url)) == (401, "UnauthorizedError")
    # Another session's shell id, an unknown one, a malformed one, an unknown session.
    assert await _tag(
        await client.delete(f"/api/session/{other}/shell/msg_routed", headers=AUTH)
    ) == (404, "MessageNotFoundError")
    assert await _tag(await client.delete(f"/api/session/{sid}/shell/msg_none", headers=AUTH)) == (
        404,
        "MessageNotFoundError",
    )
    assert await _tag(await client.delete(f"/api/session/{sid}/shell/nope", headers=AUTH)) == (
        400,
        "InvalidRequestError",
    )
    assert await _tag(
        await client.delete("/api/session/ses_none/shell/msg_routed", headers=AUTH)
    ) == (404, "SessionNotFoundError")
    assert shells.running == 1
    response = await client.delete(url, headers=AUTH)
    assert response.status == 204
    assert shells.running == 0
    entry = await (await client.get(f"/api/session/{sid}/message/msg_routed", headers=AUTH)).json()
    assert entry["data"]["shell"]["state"] == "cancelled"
    assert entry["data"]["shell"]["reason"] == "cancelled"
