"""MCP servers in tests: a real server (``mcp_server.py``, written with the SDK)
over stdio and streamable HTTP, behind a real sessionrt server on loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from http_helpers import Client, TestServer
from mcp_helpers import SERVER, MakeClient, free_port, wait_for_port

import actors.mcp._connection as connection_module
from actors.mcp import parse_servers
from actors.runtime import RuntimeConfig
from server.app import ServerSettings, make_app, runner_options


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed server may start again at once; an unanswered cancel is judged quickly."""
    monkeypatch.setattr(connection_module, "FIRST_BACKOFF_S", 0.0)
    monkeypatch.setattr(connection_module, "PROBE_S", 1.0)


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene."""


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """The file the test server writes its ``started``/``slow``/``crash`` marks to."""
    return tmp_path / "marks"


@pytest.fixture
def make_client(aiohttp_client: Callable[..., Awaitable[Client]], tmp_path: Path) -> MakeClient:
    async def make(
        servers: dict[str, Any],
        *,
        agents: str | None = None,
        settings: dict[str, Any] | None = None,
        **config: Any,
    ) -> Client:
        workdir = tmp_path / "project"
        workdir.mkdir(exist_ok=True)
        data = tmp_path / "data"
        data.mkdir(mode=0o700, exist_ok=True)
        if agents is not None:
            (data / "agents.toml").write_text(agents)
        runtime = RuntimeConfig(
            data_dir=data,
            default_directory=str(workdir),
            mcp=parse_servers(servers),
            **config,
        )
        server_settings = ServerSettings(**(settings or {}))
        app = make_app(config=runtime, settings=server_settings)
        options = runner_options(server_settings)
        options.pop("handler_cancellation")
        server = TestServer(app)
        await server.start_server(**options)
        return cast(Client, await aiohttp_client(server))

    return make


@pytest.fixture
def http_server(marks: Path) -> Iterator[Callable[..., str]]:
    """Starts ``mcp_server.py http`` (its own process group); the URL of its endpoint."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> str:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(port)],
            env={**os.environ, "MCP_TEST_MARKS": str(marks), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(process)
        wait_for_port(port)
        return f"http://127.0.0.1:{port}/mcp"

    yield start
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        process.wait()
