"""``sessionrt serve --config FILE``: server and runtime settings from TOML.

    [server]
    host = "127.0.0.1"
    port = 4096
    password = "…"              # or SESSIONRT_SERVER_PASSWORD; never empty
    cors_origins = []           # web origins whose pages may call the API ("https://app.example")
    allowed_hosts = []          # Host names served besides localhost, loopback, the bound address
    max_body_bytes = 33554432
    heartbeat_s = 15
    event_queue_bytes = 8388608 # an /api/event subscriber this far behind is dropped
    stream_write_timeout_s = 10 # a stream write without progress this long drops its reader
    shutdown_grace_s = 0.5      # what streams get to take their last frame at shutdown
    header_timeout_s = 15       # to finish a request's headers (and keep-alive idle limit)
    body_timeout_s = 30         # to receive a whole body (then 408, connection closed)

    [runtime]
    data_dir = "/var/lib/sessionrt"
    synchronous = "FULL"        # or "NORMAL"
    database = "/srv/db/sessionrt.sqlite"  # or "postgresql://…"; default: data_dir's file
    default_directory = "/srv/work"
    allow_directories = []      # e.g. ["/"]: let sessions live where the rules refuse
    secret_env = []             # more variables tools must not inherit (provider keys)
    secret_env_patterns = []    # glob patterns of more, case-insensitive: ["VAULT_*", "*_PIN"]
    max_tool_threads = 16       # tool calls at once, each in its own child actor (one thread)
    max_blocking_threads = 4    # the plain pool for blocking helpers that are not tool calls
    bash_timeout_s = 120        # a bash call's timeout unless it asks for another
    bash_max_timeout_s = 600    # the most a bash call may ask for (larger asks are clamped)
    bash_output_memory_bytes = 1048576  # per call; beyond it output streams to a managed file
    shell_output_memory_bytes = 8388608  # per user shell command; beyond it, a managed file
    shell_timeout_s = 600       # a user shell command running longer is ended (its group killed)
    tool_output_max_lines = 2000
    tool_output_max_bytes = 51200
    recover = true
    max_resume_attempts = 10
    decode_cache_bytes = 33554432        # per decode cache (stored messages, chat history)
    default_model = "local/fake-model"   # PROVIDER/MODEL; scripted when unset
    retry_base_delay_s = 2               # first retry's backoff, doubled per retry
    retry_max_delay_s = 900              # cap on a provider's retry-after
    compaction = true                    # automatic compaction (an agent may override)
    compaction_buffer = 20000            # reserved headroom, tokens
    compaction_tail_tokens = 15000       # recent tail kept verbatim, tokens
    project_instructions = true          # read the project's AGENTS.md / CLAUDE.md files
                                         # (OPENCODE_/SESSIONRT_DISABLE_PROJECT_CONFIG=1: off)
    import_scripts = false               # keep an import's metadata.script (it runs as a script)
    host_id = "web-1"                    # this host's lease owner id; random per start when unset
    lease_ttl_ms = 10000                 # an execution lease's life, renewed every ttl/4
    mcp_idle_s = 600                     # an MCP server unused this long is ended

    [providers.local]                    # real models: see actors/llm/_config.py
    kind = "openai"                      # or "anthropic"
    base_url = "http://127.0.0.1:8000/v1"
    api_key_env = "LOCAL_API_KEY"
    [providers.local.models.fake-model]
    context = 128000
    output = 4096

    [mcp.files]                          # MCP servers: see actors/mcp/_config.py
    command = ["python", "-m", "my_mcp_server"]   # stdio (or url = "http://…/mcp")
    env = { "TOKEN_VAR" = "…" }
    timeout_ms = 30000

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

__all__ = ["ConfigError", "load_config", "runtime_config"]

_TYPES: Final[dict[str, dict[str, type | tuple[type, ...]]]] = {
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
