"""Confinement probes over HTTP: a bad directory or attachment is a tagged 400, never a 500."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from http_helpers import Client, create_session, runtime_of


async def refusal(response: Any) -> dict[str, Any]:
    assert response.status == 400, await response.text()
    body: dict[str, Any] = await response.json()
    assert body["_tag"] == "InvalidRequestError"
    return body


def probes(tmp_path: Path) -> list[str]:
    (tmp_path / "a-file").write_text("x")
    return [str(tmp_path / "missing"), str(tmp_path / "a-file"), "/", str(tmp_path / "data")]


async def test_bad_directories_in_the_body(client: Client, tmp_path: Path) -> None:
    for directory in [*probes(tmp_path), str(tmp_path) + "\0"]:
        response = await client.post("/api/session", json={"location": {"directory": directory}})
        body = await refusal(response)
        assert body["field"] == "location.directory", directory
    assert (await (await client.get("/api/session")).json())["data"] == []


async def test_bad_directories_in_the_query_and_header(client: Client, tmp_path: Path) -> None:
    for directory in [*probes(tmp_path), str(tmp_path) + "\0"]:
        quoted = urllib.parse.quote(directory, safe="")
        for response in (
            await client.post(f"/api/session?directory={quoted}", json={}),
            await client.post(f"/api/session?location[directory]={quoted}", json={}),
            await client.post("/api/session", json={}, headers={"x-opencode-directory": quoted}),
        ):
            body = await refusal(response)
            assert body["field"] == "location.directory", directory
    assert (await (await client.get("/api/session")).json())["data"] == []


@pytest.mark.parametrize(
    "uri", ["file:///etc/passwd", "file:///proc/self/environ", "file:../data/sessionrt.sqlite"]
)
async def test_attachments_outside_the_directory(client: Client, uri: str) -> None:
    sid = (await create_session(client))["id"]
    files = [{"uri": uri, "mime": "text/plain"}]
    body = await refusal(
        await client.post(f"/api/session/{sid}/prompt", json={"text": "x", "files": files})
    )
    assert (body["kind"], body["field"]) == ("file", "files[0].uri")
    assert "root:" not in body["message"]
    inbox = await (await client.get(f"/api/session/{sid}/inbox")).json()
    assert inbox["data"] == []


async def test_the_database_is_refused_from_a_directory_that_holds_it(
    client: Client, tmp_path: Path
) -> None:
    # tmp_path holds the data dir; a session may live there, but not read the server's files.
    sid = (await create_session(client, location={"directory": str(tmp_path)}))["id"]
    db = runtime_of(client).config.db_path
    assert db.is_relative_to(tmp_path)
    files = [{"uri": db.as_uri(), "mime": "application/octet-stream"}]
    body = await refusal(
        await client.post(f"/api/session/{sid}/prompt", json={"text": "x", "files": files})
    )
    assert "belongs to the server" in body["message"]
    # The file's contents never reached the log.
    log = await client.get(f"/api/experimental/session/{sid}/log")
    text = await log.read()
    assert b"SQLite format" not in text
    assert b"U1FMaXRlIGZvcm1hdCAz" not in text  # nor in base64
