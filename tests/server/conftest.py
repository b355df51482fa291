"""A real server on loopback (pytest-aiohttp's test server) over a real runtime."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from http_helpers import Client, TestServer

from actors.runtime import RuntimeConfig
from server.app import ServerSettings, make_app


@pytest.fixture
def make_client(
    aiohttp_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> Callable[..., Awaitable[Client]]:
    async def make(**settings: Any) -> Client:
        workdir = tmp_path / "project"
        workdir.mkdir(exist_ok=True)
        config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
        app = make_app(config=config, settings=ServerSettings(**settings))
        return await aiohttp_client(TestServer(app))

    return make


@pytest.fixture
async def client(make_client: Callable[..., Awaitable[Client]]) -> Client:
    return await make_client()


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene."""
