"""`sessionrt serve` refuses unsafe settings at start and says why."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest
from cli_inprocess import sessionrt
from serve_proc import serving

ENV = {k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"}


async def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """A refusal at start, through the CLI's ``main`` in-process (tests/cli_inprocess.py):
    what it refuses it refuses before serving; serving itself is tested on processes."""
    done = await sessionrt(*args, env=env or ENV)
    assert done.code is not None
    return done.code, done.err


@pytest.mark.parametrize("how", ["flag", "env", "file"])
async def test_an_empty_password_is_an_error_at_start(tmp_path: Path, how: str) -> None:
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path / "data")]
    env = dict(ENV)
    if how == "flag":
        args += ["--password", ""]
    elif how == "env":
        env["SESSIONRT_SERVER_PASSWORD"] = ""
    else:
        config = tmp_path / "sessionrt.toml"
        config.write_text('[server]\npassword = ""\n')
        args += ["--config", str(config)]
    code, err = await run(*args, env=env)
    assert code == 1
    assert "empty" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("blocker", ["data", "data/sub"])
async def test_a_data_dir_that_is_a_file_is_a_sentence(tmp_path: Path, blocker: str) -> None:
    (tmp_path / "data").write_text("not a directory")
    for command in (["serve", "--port", "0"], ["sessions"]):
        code, err = await run(*command, "--data-dir", str(tmp_path / blocker))
        assert code == 1
        assert "Errno" not in err
        assert "not a directory" in err or "is a file" in err
        assert "Traceback" not in err


async def test_a_password_on_the_command_line_warns_without_showing_it(tmp_path: Path) -> None:
    flags = ("--password", "s3cret-value", "--cors-origin", "https://app.example")
    async with serving(tmp_path / "data", *flags, env=ENV) as served:
        assert served.proc.stderr is not None
        warning = (await asyncio.wait_for(served.proc.stderr.readline(), 60)).decode()
        async with aiohttp.ClientSession() as http:
            headers = {"Origin": "https://app.example", "Authorization": "Bearer s3cret-value"}
            async with http.get(f"{served.url}/api/session", headers=headers) as response:
                assert response.status == 200
                assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
        served.proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(served.proc.communicate(), 60)
    assert "--password" in warning
    assert "SESSIONRT_SERVER_PASSWORD" in warning
    assert "s3cret-value" not in warning + rest.decode()


async def test_a_bad_cors_origin_is_a_clean_error(tmp_path: Path) -> None:
    code, err = await run(
        "serve", "--data-dir", str(tmp_path / "d"), "--cors-origin", "app.example/path"
    )
    assert code == 1
    assert "origin" in err
    assert "Traceback" not in err
