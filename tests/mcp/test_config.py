"""``[mcp.<name>]`` in the config file and ``.sessionrt/mcp.toml`` in a project."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_helpers import MakeClient, marked, stdio_server

from actors.mcp import McpServerConfig, McpServers, narrow_servers, parse_servers
from server.config import ConfigError, load_config, runtime_config

DOCUMENTED = """
[mcp.files]
command = ["python", "-m", "my_mcp_server"]   # stdio
env = { "TOKEN_VAR" = "t0ken-value" }           # optional
enabled = true                                  # optional, default true
timeout_ms = 30000                              # optional, per call

[mcp.docs]
url = "http://127.0.0.1:9000/mcp"               # streamable HTTP
headers = { "authorization" = "Bearer h3ader-value" }      # optional
"""


def test_the_documented_shape_parses(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(DOCUMENTED)
    loaded = load_config(path)
    assert loaded["mcp"] == {
        "files": McpServerConfig(
            name="files",
            command=("python", "-m", "my_mcp_server"),
            env={"TOKEN_VAR": "t0ken-value"},
            timeout_ms=30000,
        ),
        "docs": McpServerConfig(
            name="docs",
            url="http://127.0.0.1:9000/mcp",
            headers={"authorization": "Bearer h3ader-value"},
        ),
    }
    config = runtime_config(loaded, tmp_path / "data", fallback_data_dir=tmp_path)
    assert set(config.mcp) == {"files", "docs"}
    assert config.mcp["docs"].transport == "http"
    shown = repr(config)
    assert "t0ken-value" not in shown
    assert "h3ader-value" not in shown
    assert "TOKEN_VAR" in shown


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[mcp.x]\ncommand = ["a"]\nurl = "http://h/mcp"', "exactly one of command"),
        ("[mcp.x]\nenabled = true", "exactly one of command"),
        ('[mcp.x]\ncommand = ["a"]\nargs = []', "unknown key mcp.x.args"),
        ('[mcp."a b"]\ncommand = ["a"]', "a server name is"),
        ('[mcp.x]\ncommand = ["a"]\ntimeout_ms = 0', "timeout_ms must be a positive integer"),
        ('[mcp.x]\ncommand = ["a"]\nenabled = "yes"', "enabled must be true or false"),
        ('[mcp.x]\nurl = "http://h/mcp"\nenv = { A = "1" }', "env is for a stdio server"),
        ('[mcp.x]\ncommand = ["a"]\nheaders = { A = "1" }', "headers is for an HTTP server"),
        ('[mcp.x]\nurl = "ftp://h"', "http:// or https://"),
        ("[mcp.x]\ncommand = []", "non-empty list of strings"),
        ('[mcp.x]\ncommand = ["a"]\nenv = { A = 1 }', "env must be a table of strings"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=complaint):
        load_config(path)


def test_a_project_can_only_narrow_the_operators_servers() -> None:
    operator = parse_servers({"files": {"command": ["a"], "timeout_ms": 5000}})
    narrowed = narrow_servers(operator, {"files": {"enabled": False, "timeout_ms": 100}})
    assert narrowed["files"].enabled is False
    assert narrowed["files"].timeout_ms == 100
    # Longer timeouts and switching on again are not narrowing: the operator's stay.
    assert narrow_servers(operator, {"files": {"timeout_ms": 99999}})["files"].timeout_ms == 5000
    off = parse_servers({"files": {"command": ["a"], "enabled": False}})
    assert narrow_servers(off, {"files": {"enabled": True}})["files"].enabled is False
    with pytest.raises(ValueError, match="only narrow a server the operator configured"):
        narrow_servers(operator, {"evil": {"command": ["rm"]}})
    with pytest.raises(ValueError, match="only enabled and timeout_ms"):
        narrow_servers(operator, {"files": {"command": ["other"]}})


async def test_a_project_file_switches_a_server_off_for_its_location(
    tmp_path: Path, marks: Path
) -> None:
    project = tmp_path / "project"
    (project / ".sessionrt").mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    await asyncio.to_thread(
        (project / ".sessionrt" / "mcp.toml").write_text, "[mcp.files]\nenabled = false\n"
    )
    servers = McpServers(parse_servers({"files": stdio_server(env={"MCP_TEST_MARKS": str(marks)})}))
    try:
        assert len(await servers.tools(str(project))) == 0
        assert await servers.guidance(str(project)) == {}
        assert marked(marks, "started") == []  # never started for that Location
        assert "files_echo" in await servers.tools(str(other))
        assert len(marked(marks, "started")) == 1
        # A project file asking for more than narrowing: no server for that Location.
        await asyncio.to_thread(
            (project / ".sessionrt" / "mcp.toml").write_text, '[mcp.x]\ncommand = ["sh"]\n'
        )
        assert len(await servers.tools(str(project))) == 0
        assert len(marked(marks, "started")) == 1
    finally:
        await servers.aclose()


def test_the_sdk_is_not_imported_until_a_server_starts(tmp_path: Path) -> None:
    script = f"""
import sys
from pathlib import Path
import server.app
from actors.mcp import parse_servers
from actors.runtime import Runtime, RuntimeConfig
config = RuntimeConfig(
    data_dir=Path({str(tmp_path / "data")!r}),
    mcp=parse_servers({{"files": {{"command": ["python", "-m", "x"]}}}}),
)
Runtime(config)
print(sorted(m for m in sys.modules if m == "mcp" or m.startswith(("mcp.", "mcp_types"))))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"


async def test_get_api_mcp_is_behind_the_password_origin_and_host_checks(
    make_client: MakeClient,
) -> None:
    servers = {
        "files": stdio_server(),
        "docs": {"url": "http://127.0.0.1:9/mcp", "enabled": False},
    }
    client = await make_client(servers, settings={"password": "pw"})
    assert (await client.get("/api/mcp")).status == 401
    auth = {"Authorization": "Bearer pw"}
    assert (await client.get("/api/mcp", headers={**auth, "Host": "evil.example"})).status == 421
    foreign = await client.get("/api/mcp", headers={**auth, "Origin": "https://evil.example"})
    assert foreign.status == 403
    response = await client.get("/api/mcp", headers=auth)
    assert response.status == 200
    data = (await response.json())["data"]
    assert data == [
        {
            "name": "docs",
            "transport": "http",
            "status": "disabled",
            "tools": [],
            "locations": [],
        },
        {"name": "files", "transport": "stdio", "status": "idle", "tools": [], "locations": []},
    ]
