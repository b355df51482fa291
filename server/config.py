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
generated from the attrs classes the keys fill (``ServerSettings``,
``RuntimeConfig``, ``ProviderConfig``) by ``scripts/gen_config_doc.py``. The
keys a file may set and their types are read from those classes' fields
(:data:`FILE_KEYS`): a field of a TOML-shaped type is a key unless marked
``metadata={"file": False}``; a ``Literal`` field takes only its values.

``[mcp.<name>]`` tables (MCP servers) are parsed by :func:`actors.mcp.parse_servers`.

``[providers]`` comes back as :class:`~actors.llm.ProviderConfig` values under
``"providers"`` and ``runtime.default_model`` as a :class:`ModelRef`, ready for
:class:`~actors.runtime.RuntimeConfig` (``provider_configs``, ``default_model``).

Command-line flags given explicitly win over the file; the file wins over the
defaults. Unknown keys and wrong types are errors, not silently ignored.
"""

from __future__ import annotations

import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from actors.llm import SCRIPTED_PROVIDER_ID, parse_model_ref, parse_providers
from actors.mcp import parse_servers
from actors.runtime import RuntimeConfig
from protocol.shapes import ModelRef
from server.app import ServerSettings
from server.serve import serve

__all__ = ["FILE_KEYS", "ConfigError", "FileKey", "file_keys", "load_config", "runtime_config"]


@attrs.frozen
class FileKey:
    """What the file may hold for one key: the Python types a TOML value of it
    decodes to, the TOML type's name (for the reference), and a Literal's values."""

    types: tuple[type, ...]
    toml: str
    choices: tuple[str, ...] = ()


def _file_key(annotation: Any) -> FileKey | None:
    """The key a field of this annotation is in a file; None for a field no file sets."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        return _file_key(rest[0]) if len(rest) == 1 else None
    if annotation is bool:
        return FileKey(types=(bool,), toml="boolean")
    if annotation is int:
        return FileKey(types=(int,), toml="integer")
    if annotation is float:
        return FileKey(types=(int, float), toml="number")
    if annotation in (str, Path):
        return FileKey(types=(str,), toml="string")
    if annotation is ModelRef:
        return FileKey(types=(str,), toml="string `PROVIDER/MODEL`")
    if typing.get_origin(annotation) is Literal and all(isinstance(a, str) for a in args):
        return FileKey(types=(str,), toml="string", choices=args)
    if typing.get_origin(annotation) is tuple and args == (str, ...):
        return FileKey(types=(list,), toml="list of strings")
    return None


def file_keys(cls: type) -> dict[str, FileKey]:
    """The keys of ``cls``'s fields a file may set, in field order: every field of
    a TOML-shaped type, but those marked ``metadata={"file": False}``."""
    hints = typing.get_type_hints(cls)
    out: dict[str, FileKey] = {}
    for field in attrs.fields(cls):
        key = _file_key(hints[field.name]) if field.metadata.get("file", True) else None
        if key is not None:
            out[field.name] = key
    return out


def _serve_keys() -> dict[str, FileKey]:
    # host and port are arguments of serve(), not ServerSettings fields.
    hints = typing.get_type_hints(serve)
    return {name: key for name in ("host", "port") if (key := _file_key(hints[name])) is not None}


#: The keys a file may set, by section: read from the attrs classes the
#: sections fill (and ``serve()``'s ``host``/``port``), never typed twice.
FILE_KEYS: Final[dict[str, dict[str, FileKey]]] = {
    "server": {**_serve_keys(), **file_keys(ServerSettings)},
    "runtime": file_keys(RuntimeConfig),
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
            wrong_bool = isinstance(value, bool) and bool not in expected.types
            if wrong_bool or not isinstance(value, expected.types):
                raise ConfigError(f"{path}: {section}.{key} has the wrong type")
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: {section}.{key} must be a list of strings")
            if expected.choices and value not in expected.choices:
                raise ConfigError(
                    f"{path}: {section}.{key} must be {' or '.join(expected.choices)}"
                )
        out[section] = dict(table)
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
