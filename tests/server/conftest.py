"""A real server on loopback (pytest-aiohttp's test server) over a real runtime."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from http_helpers import Client, TestServer

from actors.runtime import RuntimeConfig
from server.app import ServerSettings, make_app, runner_options
from storage.clock import SYSTEM, Clock


@pytest.fixture
def make_client(
    aiohttp_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> Callable[..., Awaitable[Client]]:
    async def make(clock: Clock = SYSTEM, **settings: Any) -> Client:
        """``clock``: the runtime's (what its waits and the streams' heartbeats are on)."""
        workdir = tmp_path / "project"
        workdir.mkdir(exist_ok=True)
        config = RuntimeConfig(
            data_dir=tmp_path / "data", default_directory=str(workdir), clock=clock
        )
        server_settings = ServerSettings(**settings)
        app = make_app(config=config, settings=server_settings)
        # TestServer drops its constructor's runner arguments: start it with ours
        # (it always adds handler_cancellation=True itself).
        options = runner_options(server_settings)
        options.pop("handler_cancellation")
        server = TestServer(app)
        await server.start_server(**options)
        return cast(Client, await aiohttp_client(server))

    return make


@pytest.fixture
async def client(make_client: Callable[..., Awaitable[Client]]) -> Client:
    return await make_client()


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None, slow_callbacks: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene and slow_callbacks."""
