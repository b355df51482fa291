"""The instruction entry routes over real HTTP, and the client's group in the embedded host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from http_helpers import Client, create_session, runtime_of

from actors.instructions import ENTRY_MAX_BYTES
from protocol import InstructionEntryValueTooLargeError, SessionNotFoundError
from protocol.operations import InstructionEntryInput, LogQuery
from protocol.requests import PromptInput
from server.embedded import Embedded


def entries_url(sid: str, key: str | None = None) -> str:
    base = f"/api/experimental/session/{sid}/instructions/entries"
    return base if key is None else f"{base}/{key}"


async def listed(client: Client, sid: str) -> list[dict[str, Any]]:
    response = await client.get(entries_url(sid))
    assert response.status == 200
    data: list[dict[str, Any]] = (await response.json())["data"]
    return data


async def test_put_list_remove(client: Client) -> None:
    sid = (await create_session(client))["id"]
    assert await listed(client, sid) == []
    put = await client.put(entries_url(sid, "style"), json={"value": {"tone": "terse"}})
    assert put.status == 204
    assert (await client.put(entries_url(sid, "null.ok"), json={"value": None})).status == 204
    assert await listed(client, sid) == [
        {"key": "null.ok", "value": None},
        {"key": "style", "value": {"tone": "terse"}},
    ]
    assert (await client.delete(entries_url(sid, "style"))).status == 204
    assert (await client.delete(entries_url(sid, "style"))).status == 204  # already gone
    assert await listed(client, sid) == [{"key": "null.ok", "value": None}]
    # Soft delete: the row stays, marked removed, value null.
    rows = await runtime_of(client).store.fetch(
        "SELECT key, value, removed FROM instruction_entry ORDER BY key"
    )
    assert [tuple(r) for r in rows] == [("null.ok", "null", 0), ("style", None, 1)]


async def test_a_value_over_256_kib_is_413_and_stores_nothing(client: Client) -> None:
    sid = (await create_session(client))["id"]
    value = "y" * ENTRY_MAX_BYTES
    response = await client.put(
        entries_url(sid, "big"),
        data=orjson.dumps({"value": value}),
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 413
    body = await response.json()
    assert body["_tag"] == "InstructionEntryValueTooLargeError"
    assert (body["actualBytes"], body["maxBytes"]) == (ENTRY_MAX_BYTES + 2, ENTRY_MAX_BYTES)
    assert await listed(client, sid) == []


async def test_bad_input_is_a_tagged_400_or_404(client: Client) -> None:
    sid = (await create_session(client))["id"]
    for key in ("UPPER", "-dash", "a%2Fb", "a b"):
        response = await client.put(entries_url(sid, key), json={"value": 1})
        assert response.status == 400, key
        assert (await response.json())["_tag"] == "InvalidRequestError"
    missing = await client.put(entries_url(sid, "k"), json={})
    assert (missing.status, (await missing.json())["_tag"]) == (400, "InvalidRequestError")
    for method in ("GET", "PUT", "DELETE"):
        url = entries_url("ses_nope") if method == "GET" else entries_url("ses_nope", "k")
        response = await client.request(method, url, json={"value": 1})
        assert (response.status, (await response.json())["_tag"]) == (
            404,
            "SessionNotFoundError",
        )
    assert await runtime_of(client).store.fetch("SELECT * FROM instruction_entry") == []


async def test_the_routes_need_the_password(make_client: Any) -> None:
    client = await make_client(password="s3cret")
    bearer = {"Authorization": "Bearer s3cret"}
    created = await client.post("/api/session", json={}, headers=bearer)
    sid = (await created.json())["data"]["id"]
    for method, url in (
        ("GET", entries_url(sid)),
        ("PUT", entries_url(sid, "k")),
        ("DELETE", entries_url(sid, "k")),
    ):
        response = await client.request(method, url, json={"value": 1})
        assert response.status == 401, (method, url)
    assert await runtime_of(client).store.fetch("SELECT * FROM instruction_entry") == []


async def test_the_embedded_client_group_and_the_next_step(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    async with Embedded(tmp_path / "data") as oc:
        session = await oc.sessions.create()
        await oc.instructions.put(session.id, "goal", InstructionEntryInput(value="ship it"))
        assert [(e.key, e.value) for e in await oc.instructions.list(session.id)] == [
            ("goal", "ship it")
        ]
        await oc.sessions.prompt(session.id, PromptInput(text="one"))
        await oc.sessions.wait(session.id)
        await oc.instructions.remove(session.id, "goal")
        await oc.sessions.prompt(session.id, PromptInput(text="two"))
        await oc.sessions.wait(session.id)
        log = [e async for e in oc.sessions.log(session.id, LogQuery())]
        deltas = [e.data for e in log if e.event == "session.instructions.updated"]
        assert len(deltas) == 2
        assert "api/goal" in deltas[0]["data"]["delta"]
        assert deltas[1]["data"]["delta"] == {"api/goal": "removed"}
        assert deltas[1]["data"]["text"] == 'The context under "goal" no longer applies.'
        with pytest.raises(InstructionEntryValueTooLargeError) as refused:
            await oc.instructions.put(
                session.id, "big", InstructionEntryInput(value="z" * ENTRY_MAX_BYTES)
            )
        assert refused.value.fields["maxBytes"] == ENTRY_MAX_BYTES
        with pytest.raises(SessionNotFoundError):
            await oc.instructions.list("ses_missing")
        await oc.instructions.put(session.id, "none", InstructionEntryInput(value=None))
        assert [(e.key, e.value) for e in await oc.instructions.list(session.id)] == [
            ("none", None)
        ]
