"""``sessionrt serve --config FILE``: server and runtime settings from TOML.

    [server]
    host = "127.0.0.1"
    port = 4096
    password = "…"              # or SESSIONRT_SERVER_PASSWORD
    max_body_bytes = 33554432
    heartbeat_s = 15

    [runtime]
    data_dir = "/var/lib/sessionrt"
    synchronous = "FULL"        # or "NORMAL"
    default_directory = "/srv/work"
    allow_directories = []      # e.g. ["/"]: let sessions live where the rules refuse
    secret_env = []             # more variables tools must not inherit (provider keys)
    max_tool_threads = 16
    tool_output_max_lines = 2000
    tool_output_max_bytes = 51200
    recover = true
    max_resume_attempts = 10

Command-line flags given explicitly win over the file; the file wins over the
defaults. Unknown keys and wrong types are errors, not silently ignored.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Final

__all__ = ["ConfigError", "load_config"]

_TYPES: Final[dict[str, dict[str, type | tuple[type, ...]]]] = {
    "server": {
        "host": str,
        "port": int,
        "password": str,
        "max_body_bytes": int,
        "heartbeat_s": (int, float),
    },
    "runtime": {
        "data_dir": str,
        "synchronous": str,
        "default_directory": str,
        "allow_directories": list,
        "secret_env": list,
        "max_tool_threads": int,
        "tool_output_max_lines": int,
        "tool_output_max_bytes": int,
        "recover": bool,
        "max_resume_attempts": int,
    },
}


class ConfigError(Exception):
    """The configuration file cannot be used; the message says why."""


def load_config(path: Path) -> dict[str, dict[str, Any]]:
    """The file's ``[server]`` and ``[runtime]`` tables, checked (blocking I/O)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    out: dict[str, dict[str, Any]] = {}
    for section, table in document.items():
        if section not in _TYPES:
            raise ConfigError(f"{path}: unknown section [{section}]")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{section}] must be a table")
        for key, value in table.items():
            expected = _TYPES[section].get(key)
            if expected is None:
                raise ConfigError(f"{path}: unknown key {section}.{key}")
            wrong_bool = isinstance(value, bool) and expected is not bool
            if wrong_bool or not isinstance(value, expected):
                raise ConfigError(f"{path}: {section}.{key} has the wrong type")
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: {section}.{key} must be a list of strings")
        out[section] = dict(table)
    synchronous = out.get("runtime", {}).get("synchronous")
    if synchronous not in (None, "FULL", "NORMAL"):
        raise ConfigError(f"{path}: runtime.synchronous must be FULL or NORMAL")
    return out
