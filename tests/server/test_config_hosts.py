"""``[runtime] host_id`` and ``lease_ttl_ms`` in the config file: parsed or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.runtime import Runtime
from server.config import ConfigError, load_config, runtime_config


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_the_host_keys_reach_the_runtime(tmp_path: Path) -> None:
    loaded = load_config(_config(tmp_path, '[runtime]\nhost_id = "web-1"\nlease_ttl_ms = 4000\n'))
    config = runtime_config(loaded, None, fallback_data_dir=tmp_path)
    assert (config.host_id, config.lease_ttl_ms) == ("web-1", 4000)
    runtime = Runtime(config)
    assert runtime.host_id == "web-1"
    assert runtime.leases.interval_s == 1.0


def test_without_a_host_id_each_runtime_is_a_new_host(tmp_path: Path) -> None:
    config = runtime_config(load_config(_config(tmp_path, "")), None, fallback_data_dir=tmp_path)
    assert Runtime(config).host_id != Runtime(config).host_id


def test_a_wrong_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lease_ttl_ms"):
        load_config(_config(tmp_path, '[runtime]\nlease_ttl_ms = "soon"\n'))


def test_a_lease_too_short_to_renew_is_refused(tmp_path: Path) -> None:
    loaded = load_config(_config(tmp_path, "[runtime]\nlease_ttl_ms = 10\n"))
    with pytest.raises(ValueError, match="lease_ttl_ms"):
        Runtime(runtime_config(loaded, None, fallback_data_dir=tmp_path))
