"""No secret of the server's environment reaches a user shell (issue 35, point 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.runtime import RuntimeConfig
from protocol.operations import ShellInput
from protocol.requests import CreateSessionInput
from protocol.shapes import Location
from server.embedded import Embedded
from tests.shell.conftest import until


async def test_a_shell_gets_neither_a_pass_nor_an_operator_pattern(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DB_PASS", "canary-db-pass")
    monkeypatch.setenv("MYSQL_PWD", "canary-mysql-pwd")
    monkeypatch.setenv("VAULT_ADDR", "canary-vault")
    monkeypatch.setenv("SESSIONRT_HARMLESS", "kept")
    config = RuntimeConfig(data_dir=tmp_path / "data", secret_env_patterns=("vault_*",))
    async with Embedded(config=config) as oc:
        s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        await oc.sessions.shell(s.id, ShellInput(command="env"))
        (ended,) = await until(oc, s.id, "session.shell.ended")
    assert "SESSIONRT_HARMLESS=kept" in ended["output"]
    for canary in ("canary-db-pass", "canary-mysql-pwd", "canary-vault"):
        assert canary not in ended["output"]


def test_a_secret_env_pattern_must_be_a_pattern(tmp_path: Path) -> None:
    from actors.runtime import Runtime

    with pytest.raises(ValueError, match="secret_env_patterns"):
        Runtime(RuntimeConfig(data_dir=tmp_path, secret_env_patterns=("EXACT",)))


def test_the_config_file_sets_the_new_runtime_keys(tmp_path: Path) -> None:
    from server.config import load_config, runtime_config

    path = tmp_path / "sessionrt.toml"
    path.write_text(
        '[runtime]\nsecret_env_patterns = ["VAULT_*"]\nshell_timeout_s = 30\n'
        "import_scripts = true\n"
    )
    config = runtime_config(load_config(path), tmp_path / "data", fallback_data_dir=tmp_path)
    assert config.secret_env_patterns == ("VAULT_*",)
    assert config.shell_timeout_s == 30
    assert config.import_scripts is True
