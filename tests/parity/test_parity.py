"""One scenario suite, run unchanged over the network and embedded: identical results."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from actors.runtime import RuntimeConfig
from protocol import Location, SessionNotFoundError, codec
from protocol.client import Client
from protocol.operations import LogQuery, SessionListQuery
from protocol.requests import CreateSessionInput, PromptInput, UpdateSessionInput
from server.app import make_app
from server.embedded import Embedded

_ID = re.compile(r"\b(ses|msg|evt|tool)_[0-9A-Za-z_-]+")


def normalize(value: Any) -> Any:
    """Replace ids and times so two runs can be compared."""
    ids: dict[str, str] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: "<t>"
                if k in ("created", "updated", "timeCreated", "started", "idle", "viewed")
                else walk(x)
                for k, x in v.items()
            }
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return _ID.sub(lambda m: ids.setdefault(m.group(0), f"<{m.group(1)}{len(ids)}>"), v)
        return v

    return walk(codec.to_json(value))


async def scenario(api: Any, workdir: Path) -> list[Any]:
    out: list[Any] = []
    session = await api.sessions.create(
        CreateSessionInput(title="parity", location=Location(directory=str(workdir)))
    )
    out.append(session)
    script = '#tool write {"path": "a.txt", "content": "x"}\n#step\n#text done'
    out.append(await api.sessions.prompt(session.id, PromptInput(id="msg_fixed", text=script)))
    out.append(await api.sessions.prompt(session.id, PromptInput(id="msg_fixed", text="retry")))
    await api.sessions.wait(session.id)
    queued = await api.sessions.prompt(
        session.id, PromptInput(text="later", delivery="queue", resume=False)
    )
    out.append(await api.sessions.inbox(session.id))
    await api.sessions.cancel(session.id, queued.id)
    # A second cancel of the same item is answered like the first.
    out.append(await api.sessions.cancel(session.id, queued.id))
    try:
        await api.sessions.get("ses_missing")
    except SessionNotFoundError as err:
        out.append(err.to_wire())
    await api.sessions.update(session.id, UpdateSessionInput(title="renamed"))
    out.append(await api.sessions.get(session.id))
    page = await api.sessions.messages(session.id, None)
    out.append(page.data)
    out.append(await api.sessions.context(session.id))
    out.append((await api.sessions.list(SessionListQuery(limit=5))).data)
    out.append([(e.id, e.event) async for e in api.sessions.log(session.id, LogQuery())])
    return out


class Network:
    def __init__(self, client: Client) -> None:
        self.sessions = client.sessions
        self.events = client.events


@contextlib.asynccontextmanager
async def serving(mode: str, config: RuntimeConfig) -> AsyncIterator[Any]:
    """The client API over a real loopback server, or embedded."""
    if mode == "embedded":
        async with Embedded(config=config) as oc:
            yield oc
        return
    runner = web.AppRunner(make_app(config=config), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with Client(f"http://{host}:{port}") as client:
            yield Network(client)
    finally:
        await runner.cleanup()


@pytest.fixture(params=["network", "embedded"])
async def api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with serving(request.param, config) as served:
        yield served


async def test_the_scenario_holds_in_both_transports(api: Any, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    out = normalize(await scenario(api, workdir))
    assert out[1] == out[2]  # an exact retry returns the first admission
    assert out[4] is None
    assert out[5]["_tag"] == "SessionNotFoundError"
    assert (workdir / "a.txt").read_text() == "x"


async def test_both_transports_give_identical_results(tmp_path: Path) -> None:
    results = []
    for mode in ("network", "embedded"):
        # Directory names of one length: the model is told its working directory,
        # and the scripted model's token counts follow the request's length.
        base = tmp_path / mode[:3]
        base.mkdir()
        workdir = base / "work"
        workdir.mkdir()
        config = RuntimeConfig(data_dir=base / "data", default_directory=str(base))
        async with serving(mode, config) as served:
            results.append(normalize(await scenario(served, workdir)))
    network, embedded = results
    # Locations differ by the mode's directory name only.
    assert str(network).replace("/net/", "/X/") == str(embedded).replace("/emb/", "/X/")
