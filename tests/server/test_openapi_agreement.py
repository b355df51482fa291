"""The OpenAPI document and the server agree on each case issue 35 found apart.

Each case is a request; the document's schema for it (the body's, or the
query parameter's) is asked whether it is valid, and the live server whether
it accepts it: the two answers must be the same. schemathesis
(test_schemathesis.py) then looks for more, generated.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from http_helpers import Client, create_session

from protocol.openapi import document

DOC = document()


def _body_schema(path: str, method: str) -> dict[str, Any]:
    schema = DOC["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": DOC["components"]}


def _query_schema(path: str, name: str) -> dict[str, Any]:
    (param,) = [p for p in DOC["paths"][path]["get"]["parameters"] if p["name"] == name]
    schema: dict[str, Any] = param["schema"]
    return schema


def _valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


BODIES = [
    ("/api/session/{sessionID}/view", "/view", {"idle": 2.3e7}),
    ("/api/session/{sessionID}/view", "/view", {"idle": 2.5}),
    ("/api/session/{sessionID}/compact", "/compact", {"id": None}),
    ("/api/session/{sessionID}/fork", "/fork", {"before": None}),
    ("/api/session/{sessionID}/prompt", "/prompt", {"text": "x", "resume": None}),
    ("/api/session/{sessionID}/agent", "/agent", {"agent": ""}),
    ("/api/session/{sessionID}/model", "/model", {"model": {"id": "m", "providerID": ""}}),
    ("/api/session/{sessionID}/model", "/model", {"model": {"id": "", "providerID": "scripted"}}),
    ("/api/session/{sessionID}/generate", "/generate", {"prompt": ""}),
    ("/api/session/{sessionID}/generate", "/generate", {"prompt": "  "}),
    ("/api/session/{sessionID}/shell", "/shell", {"command": " "}),
    ("/api/session", "", {"agent": ""}),
    ("/api/session", "", {"location": {"directory": ""}}),
    ("/api/session", "", {"location": {"directory": "relative/dir"}}),
    ("/api/session", "", {"title": None, "metadata": None}),
]


@pytest.mark.parametrize(("path", "suffix", "body"), BODIES, ids=lambda v: str(v))
async def test_a_body_the_document_refuses_the_server_refuses_and_back(
    client: Client, path: str, suffix: str, body: Any
) -> None:
    sid = (await create_session(client))["id"]
    url = f"/api/session/{sid}{suffix}" if suffix else "/api/session"
    response = await client.post(url, json=body)
    assert response.status < 500, await response.text()
    accepted = response.status < 300
    assert accepted == _valid(_body_schema(path, "post"), body), await response.text()


QUERIES = [
    ("/api/session/{sessionID}/diff", "to", ""),
    ("/api/session/{sessionID}/diff", "from", "nope"),
    ("/api/session", "cursor", ""),
    ("/api/session", "parentID", ""),
    ("/api/session", "parentID", "null"),
    ("/api/session/{sessionID}/message", "cursor", ""),
]


@pytest.mark.parametrize(("path", "name", "value"), QUERIES, ids=lambda v: str(v))
async def test_a_query_value_the_document_refuses_the_server_refuses_and_back(
    client: Client, path: str, name: str, value: str
) -> None:
    sid = (await create_session(client))["id"]
    response = await client.get(path.replace("{sessionID}", sid), params={name: value})
    assert response.status < 500
    accepted = response.status < 300
    assert accepted == _valid(_query_schema(path, name), value), await response.text()


async def test_a_method_the_literal_route_lacks_is_a_405_with_its_own_allow(
    client: Client,
) -> None:
    for method in ("PATCH", "DELETE", "OPTIONS", "POST"):
        response = await client.request(method, "/api/session/active", json={})
        assert response.status == 405, (method, await response.text())
        assert (await response.json())["_tag"] == "MethodNotAllowedError"
        assert response.headers["Allow"] == "GET, HEAD"
    assert set(DOC["paths"]["/api/session/active"]) == {"get"}


async def test_the_log_stream_is_documented_as_its_frames(client: Client) -> None:
    content = DOC["paths"]["/api/experimental/session/{sessionID}/log"]["get"]["responses"]["200"]
    schema = content["content"]["text/event-stream"]["schema"]
    frame = {"id": "1", "event": "session.created", "data": '{"type": "session.created"}'}
    assert _valid(schema, frame)
    assert not _valid(schema, "id: 1\nevent: x\ndata: {}\n\n")
