"""Bounds and bad input (issue 35, point 6): entries capped in total, environments typed."""

from __future__ import annotations

from typing import Any

import pytest
from http_helpers import Client, create_session

from actors.instructions.entries import MAX_ENTRIES, MAX_TOTAL_BYTES


def _entry(sid: str, key: str) -> str:
    return f"/api/experimental/session/{sid}/instructions/entries/{key}"


async def _keys(client: Client, sid: str) -> list[str]:
    body = await (await client.get(f"/api/experimental/session/{sid}/instructions/entries")).json()
    return [e["key"] for e in body["data"]]


async def test_a_session_holds_a_bounded_number_of_entries(client: Client) -> None:
    sid = (await create_session(client))["id"]
    for n in range(MAX_ENTRIES):
        response = await client.put(_entry(sid, f"k{n}"), json={"value": n})
        assert response.status == 204
    response = await client.put(_entry(sid, "one-more"), json={"value": 1})
    assert response.status == 413
    body = await response.json()
    assert (body["_tag"], body["maxEntries"]) == ("InstructionEntriesFullError", MAX_ENTRIES)
    # Replacing one that is there is no new entry.
    assert (await client.put(_entry(sid, "k0"), json={"value": "new"})).status == 204
    assert len(await _keys(client, sid)) == MAX_ENTRIES
    assert "one-more" not in await _keys(client, sid)


async def test_a_sessions_entries_are_bounded_in_bytes_in_all(client: Client) -> None:
    sid = (await create_session(client))["id"]
    big = "x" * (200 * 1024)
    fits = MAX_TOTAL_BYTES // (len(big) + 2)
    for n in range(fits):
        assert (await client.put(_entry(sid, f"big{n}"), json={"value": big})).status == 204
    response = await client.put(_entry(sid, "over"), json={"value": big})
    assert response.status == 413
    assert (await response.json())["maxBytes"] == MAX_TOTAL_BYTES
    # A smaller value in place of a big one fits again.
    assert (await client.put(_entry(sid, "big0"), json={"value": "small"})).status == 204
    assert (await client.put(_entry(sid, "over"), json={"value": "small"})).status == 204


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"variables": {"x": 1.5}}, "variables.x"),
        ({"variables": {"x": []}}, "variables.x"),
        ({"variables": {"x": None}}, "variables.x"),
        ({"variables": {"x": {"y": "z"}}}, "variables.x"),
        ({"variables": "x=1"}, "variables"),
    ],
)
async def test_an_environment_with_a_value_that_is_no_string_is_a_400(
    client: Client, body: Any, field: str
) -> None:
    sid = (await create_session(client))["id"]
    response = await client.put(f"/api/session/{sid}/environment", json=body)
    assert response.status == 400, await response.text()
    answer = await response.json()
    assert (answer["_tag"], answer["field"]) == ("InvalidRequestError", field)
