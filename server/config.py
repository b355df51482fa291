"""``sessionrt serve --config FILE``: server and runtime settings from TOML.

    [server]
    port = 4096

    [runtime]
    data_dir = "/var/lib/sessionrt"
    default_model = "local/fake-model"   # PROVIDER/MODEL; scripted when unset

    [providers.local]                    # real models: see actors/llm/_config.py
    kind = "openai"                      # or "anthropic"
    base_url = "http://127.0.0.1:8000/v1"
    api_key_env = "LOCAL_API_KEY"
    [providers.local.models.fake-model]
    context = 128000
    output = 4096

Every key with its type, default and meaning is in ``docs/configuration.md``,
generated from :data:`FILE_KEYS` and the attrs classes the keys fill
(``ServerSettings``, ``RuntimeConfig``, ``ProviderConfig``) by
``scripts/gen_config_doc.py``.

``[mcp.<name>]`` tables (MCP servers) are parsed by :func:`actors.mcp.parse_servers`.

``[providers]`` comes back as :class:`~actors.llm.ProviderConfig` values under
``"providers"`` and ``runtime.default_model`` as a :class:`ModelRef`, ready for
:class:`~actors.runtime.RuntimeConfig` (``provider_configs``, ``default_model``).

Command-line flags given explicitly win over the file; the file wins over the
defaults. Unknown keys and wrong types are errors, not silently ignored.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Final

from actors.llm import SCRIPTED_PROVIDER_ID, parse_model_ref, parse_providers
from actors.mcp import parse_servers
from actors.runtime import RuntimeConfig

__all__ = ["FILE_KEYS", "ConfigError", "load_config", "runtime_config"]

#: The keys a file may set, by section, with the types the loader accepts.
FILE_KEYS: Final[dict[str, dict[str, type | tuple[type, ...]]]] = {
    "server": {
        "host": str,
        "port": int,
        "password": str,
        "max_body_bytes": int,
        "heartbeat_s": (int, float),
        "cors_origins": list,
        "allowed_hosts": list,
        "event_queue_bytes": int,
        "stream_write_timeout_s": (int, float),
        "shutdown_grace_s": (int, float),
        "header_timeout_s": (int, float),
        "body_timeout_s": (int, float),
    },
    "runtime": {
        "data_dir": str,
        "synchronous": str,
        "database": str,
        "default_directory": str,
        "allow_directories": list,
        "secret_env": list,
        "secret_env_patterns": list,
        "max_tool_threads": int,
        "max_blocking_threads": int,
        "bash_timeout_s": (int, float),
        "bash_max_timeout_s": (int, float),
        "bash_output_memory_bytes": int,
        "shell_output_memory_bytes": int,
        "shell_timeout_s": (int, float),
        "tool_output_max_lines": int,
        "tool_output_max_bytes": int,
        "recover": bool,
        "max_resume_attempts": int,
        "host_id": str,
        "lease_ttl_ms": int,
        "default_model": str,
        "retry_base_delay_s": (int, float),
        "retry_max_delay_s": (int, float),
        "decode_cache_bytes": int,
        "compaction": bool,
        "compaction_buffer": int,
        "compaction_tail_tokens": int,
        "project_instructions": bool,
        "import_scripts": bool,
        "mcp_idle_s": (int, float),
        "subagent_max_depth": int,
        "subagent_max_children": int,
    },
}
#: Sections with a nested shape of their own, parsed by their owner.
_NESTED: Final = ("providers", "mcp")


class ConfigError(Exception):
    """The configuration file cannot be used; the message says why."""


def load_config(path: Path) -> dict[str, dict[str, Any]]:
    """The file's ``[server]``, ``[runtime]`` and ``[providers]`` tables, checked (blocking I/O)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    out: dict[str, dict[str, Any]] = {}
    for section, table in document.items():
        if section in _NESTED:
            continue
        if section not in FILE_KEYS:
            raise ConfigError(f"{path}: unknown section [{section}]")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{section}] must be a table")
        for key, value in table.items():
            expected = FILE_KEYS[section].get(key)
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
    providers = document.get("providers", {})
    if not isinstance(providers, dict):
        raise ConfigError(f"{path}: [providers] must be a table")
    try:
        out["providers"] = parse_providers(providers)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        out["mcp"] = parse_servers(document.get("mcp", {}))
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    default_model = out.get("runtime", {}).get("default_model")
    if default_model is not None:
        _default_model(path, out, default_model)
    return out


def _default_model(path: Path, out: dict[str, dict[str, Any]], value: str) -> None:
    try:
        model = parse_model_ref(value)
    except ValueError as exc:
        raise ConfigError(f"{path}: runtime.default_model: {exc}") from None
    provider = out["providers"].get(model.provider_id)
    if provider is None and model.provider_id != SCRIPTED_PROVIDER_ID:
        raise ConfigError(
            f"{path}: runtime.default_model names provider {model.provider_id!r},"
            " which no [providers.*] table configures"
        )
    if provider is not None and model.id not in provider.models:
        raise ConfigError(
            f"{path}: runtime.default_model: provider {model.provider_id!r} has no model"
            f" {model.id!r} (add [providers.{model.provider_id}.models.{model.id}])"
        )
    out["runtime"]["default_model"] = model


def runtime_config(
    loaded: dict[str, dict[str, Any]],
    data_dir: Path | None,
    *,
    fallback_data_dir: Path,
    **overrides: Any,
) -> RuntimeConfig:
    """The runtime settings of a loaded file: ``data_dir`` (a flag) wins over the
    file's, which wins over ``fallback_data_dir``; ``overrides`` (flags) win too."""
    runtime = dict(loaded.get("runtime", {}))
    from_file = runtime.pop("data_dir", None)
    chosen = data_dir or (Path(from_file) if from_file else fallback_data_dir)
    runtime.update(overrides)
    return RuntimeConfig(
        data_dir=chosen,
        provider_configs=loaded.get("providers", {}),
        mcp=loaded.get("mcp", {}),
        **runtime,
    )
