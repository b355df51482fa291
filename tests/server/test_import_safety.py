"""An imported session is trusted no more than a created one (issue 35, point 2).

Each test posts a transfer document over HTTP to a real server. A script in
its metadata used to run as the scripted model's directives (``touch PWNED``
on the next prompt); an unknown agent, an unconfigured model, a parentID
naming a session of this server, a cost of -1e308 were accepted; a large
document was decoded on the event loop.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from http_helpers import Client, create_session, runtime_of

from protocol import codec
from protocol.errors import InvalidRequestError

MakeClient = Callable[..., Awaitable[Client]]
ZERO = {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}
PWNED = '#tool bash {"command": "touch PWNED"}\n#step\n#text pwned'


def _document(directory: Path, sid: str = "ses_imported0000000000000001", **info: Any) -> Any:
    return {
        "info": {
            "id": sid,
            "title": "imported",
            "location": {"directory": str(directory)},
            "time": {"created": 1, "updated": 1},
            "tokens": {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}},
            "cost": 0,
            **info,
        },
        "messages": [
            {
                "type": "user",
                "id": "msg_imported00000000000000001",
                "seq": 1,
                "sessionID": sid,
                "time": {"created": 1, "updated": 1},
                "text": "earlier",
            }
        ],
    }


async def _import(client: Client, document: Any) -> tuple[int, Any]:
    response = await client.post("/api/experimental/session/import", json=document)
    return response.status, await response.json()


async def _prompt_and_wait(client: Client, sid: str, text: str) -> None:
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": text})
    assert response.status == 200, await response.text()
    response = await client.post(f"/api/experimental/session/{sid}/wait")
    assert response.status == 204


async def test_an_imported_script_is_dropped_and_never_runs(client: Client, tmp_path: Path) -> None:
    work = tmp_path / "project"
    status, body = await _import(client, _document(work, metadata={"script": PWNED, "k": 1}))
    assert status == 200, body
    assert body["data"]["metadata"] == {"k": 1}
    await _prompt_and_wait(client, body["data"]["id"], "hello")
    assert not (work / "PWNED").exists()


async def test_the_operator_may_keep_imported_scripts(tmp_path: Path) -> None:
    from actors.runtime import RuntimeConfig
    from protocol.requests import PromptInput
    from protocol.shapes import SessionExport
    from server.embedded import Embedded

    work = tmp_path / "project"
    work.mkdir()
    document = codec.from_json(SessionExport, _document(work, metadata={"script": PWNED}))
    config = RuntimeConfig(data_dir=tmp_path / "data", import_scripts=True)
    async with Embedded(config=config) as oc:
        session = await oc.sessions.import_session(document)
        assert session.metadata == {"script": PWNED}
        await oc.sessions.prompt(session.id, PromptInput(text="hello"))
        await oc.sessions.wait(session.id)
    assert (work / "PWNED").exists()  # what the operator allowed: the script ran


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"agent": "no-such-agent"}, "info.agent"),
        ({"model": {"id": "m", "providerID": "nowhere"}}, "info.model"),
        ({"cost": -1e308}, "info.cost"),
        ({"cost": 1e300}, "info.cost"),
        (
            {
                "tokens": {
                    "input": -5,
                    "output": 0,
                    "reasoning": 0,
                    "cache": {"read": 0, "write": 0},
                }
            },
            "info.tokens",
        ),
        ({"id": "msg_notasession"}, "info.id"),
        ({"extra": 1}, "info.extra"),
    ],
)
async def test_import_checks_info_as_create_does(
    client: Client, tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    status, body = await _import(client, _document(tmp_path / "project", **change))
    assert (status, body["_tag"], body.get("field")) == (400, "InvalidRequestError", field)
    listed = await (await client.get("/api/session")).json()
    assert listed["data"] == []


async def test_a_parent_id_naming_a_session_here_is_refused(client: Client, tmp_path: Path) -> None:
    victim = (await create_session(client))["id"]
    status, body = await _import(client, _document(tmp_path / "project", parentID=victim))
    assert (status, body.get("field")) == (400, "info.parentID")
    children = await (await client.get("/api/session", params={"parentID": victim})).json()
    assert children["data"] == []
    # A parent that is not here leaves the import a root, as before.
    status, body = await _import(
        client, _document(tmp_path / "project", parentID="ses_elsewhere0000000000000001")
    )
    assert status == 200
    assert "parentID" not in body["data"]


async def test_a_bad_message_is_refused_by_its_index_and_nothing_is_written(
    client: Client, tmp_path: Path
) -> None:
    document = _document(tmp_path / "project")
    good = document["messages"][0]
    many = []
    for n in range(2000):
        item = copy.deepcopy(good)
        item["id"] = f"msg_imported{n:017d}"
        many.append(item)
    bad = {
        "type": "assistant",
        "id": "msg_importedbad000000000001",
        "seq": 1,
        "sessionID": good["sessionID"],
        "time": {"created": 1, "updated": 1},
        "parts": [],
        "cost": -1.0,
    }
    document["messages"] = [*many, bad]
    status, body = await _import(client, document)
    assert (status, body.get("field")) == (400, "messages[2000].cost")
    document["messages"] = [*many, {"type": "user", "nonsense": True}]
    status, body = await _import(client, document)
    assert status == 400
    assert body["field"].startswith("messages[2000]")
    listed = await (await client.get("/api/session")).json()
    assert listed["data"] == []


async def test_a_large_import_is_parsed_and_checked_off_the_loop(
    client: Client, tmp_path: Path
) -> None:
    runtime = runtime_of(client)
    ran: list[str] = []
    real = runtime.blocking.run

    async def recording(fn: Any, *args: Any, **kw: Any) -> Any:
        ran.append(getattr(fn, "__name__", repr(fn)))
        return await real(fn, *args, **kw)

    runtime.blocking.run = recording
    runtime.transfer._blocking = recording
    status, _ = await _import(client, _document(tmp_path / "project"))
    assert status == 200
    assert "loads_in_pieces" in ran
    assert "_imported_json" in ran


DOCS = [
    b'{"info": {"a": [1, 2.5, "x", null, true]}, "messages": [{"b": {"c": [1]}}, [], {}]}',
    b'  [ {"k": "\\u00e9\\ud83d\\ude00"} , 1 , "s" ]  ',
    b'{"messages": []}',
    b"{}",
    b'"plain"',
]
BAD = [
    b'{"a": NaN}',
    b'{"messages": [1e400]}',
    b'{"messages": ["\\ud800"]}',
    b'{"a": 1} trailing',
    b'{"a" 1}',
    b'{"messages": [1,]}',
    b"\xff\xfe",
    b'{"a": 1,}',
]


@pytest.mark.parametrize("raw", DOCS)
def test_loads_in_pieces_reads_what_the_codec_reads(raw: bytes) -> None:
    from server._decode import loads_in_pieces

    assert loads_in_pieces(raw) == codec.loads(raw) == orjson.loads(raw)


@pytest.mark.parametrize("raw", BAD)
def test_loads_in_pieces_refuses_what_the_codec_refuses(raw: bytes) -> None:
    from server._decode import loads_in_pieces

    with pytest.raises(InvalidRequestError):
        codec.loads(raw)
    with pytest.raises(InvalidRequestError) as caught:
        loads_in_pieces(raw)
    assert caught.value.fields["kind"] == "json"
