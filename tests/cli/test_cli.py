"""The console script, run as a real subprocess; what fails before serving (usage and
configuration errors) through the CLI's ``main`` in-process (tests/cli_inprocess.py)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cli_inprocess import sessionrt
from serve_proc import EXE, Served, serving


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(tmp_path / "data", guard_s=30) as served:
        yield served


async def test_serve_answers_http_and_stops_cleanly_on_sigterm(
    served: Served, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{served.url}/api/session", json={"title": "cli"}) as response:
            assert response.status == 200
            session = (await response.json())["data"]
        async with http.post(
            f"{served.url}/api/session/{session['id']}/prompt", json={"text": "hi"}
        ) as response:
            assert response.status == 200
    served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.proc.wait(), 30) == 0
    assert (tmp_path / "data" / "sessionrt.sqlite").exists()


async def test_serve_defaults_to_the_xdg_data_home(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    proc = await asyncio.create_subprocess_exec(
        EXE, "serve", "--port", "0", env=env, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.readline(), 30)
    proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert (tmp_path / "sessionrt" / "sessionrt.sqlite").exists()


async def test_binding_beyond_loopback_without_a_password_warns(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"},
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    warning = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    await asyncio.wait_for(proc.stdout.readline(), 30)  # listening
    assert "WARNING" in warning
    assert "without a password" in warning
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_an_unusable_data_dir_is_a_clean_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = await sessionrt("serve", "--data-dir", str(blocker / "sub"))
    assert done.code == 1
    assert done.err.startswith("sessionrt: ")


@pytest.mark.parametrize("args", [(), ("bogus",)])
async def test_usage_errors(args: tuple[str, ...]) -> None:
    done = await sessionrt(*args)
    assert done.code == 2
    assert "usage" in done.err


async def test_serve_reads_a_config_file_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "sessionrt.toml"
    config.write_text(
        f'[server]\nport = 1\npassword = "from-file"\n\n'
        f'[runtime]\ndata_dir = "{tmp_path / "from-config"}"\nsynchronous = "NORMAL"\n'
    )
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"},
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    url = re.search(r"http://\S+", line)
    assert url  # --port 0 beat the file's port 1
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url.group(0)}/api/session") as response:
                assert response.status == 401  # the file's password is on
            bearer = {"Authorization": "Bearer from-file"}
            async with http.get(f"{url.group(0)}/api/session", headers=bearer) as response:
                assert response.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert (tmp_path / "from-config" / "sessionrt.sqlite").exists()


@pytest.mark.parametrize(
    "text",
    [
        "[server]\nport = 'x'\n",
        "[nope]\n",
        "[runtime]\nsynchronous = 'OFF'\n",
        "not toml [",
        "[runtime]\nallow_directories = '/'\n",
        "[runtime]\nsecret_env = [1]\n",
    ],
)
async def test_a_bad_config_file_is_a_clean_error(tmp_path: Path, text: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    done = await sessionrt("serve", "--config", str(config), "--data-dir", str(tmp_path))
    assert done.code == 1
    assert done.err.startswith("sessionrt: ")
    assert str(config) in done.err


@pytest.mark.parametrize("directory", ["/", "missing"])
async def test_a_refused_default_directory_is_a_clean_error(tmp_path: Path, directory: str) -> None:
    config = tmp_path / "sessionrt.toml"
    config.write_text(f'[runtime]\ndefault_directory = "{tmp_path / directory}"\n')
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "serve",
        "--config",
        str(config),
        "--data-dir",
        str(tmp_path / "data"),
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert b"Traceback" not in err
    assert b"runtime.default_directory" in err
