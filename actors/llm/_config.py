"""What a configured model provider is: :class:`ProviderConfig` and its models.

Parsed from the ``[providers.<id>]`` tables of ``sessionrt serve --config``::

    [providers.local]
    kind = "openai"                        # or "anthropic"
    base_url = "http://127.0.0.1:8000/v1"  # anthropic: the host root
    api_key_env = "LOCAL_API_KEY"          # optional
    headers = { "x-extra" = "1" }          # optional

    [providers.local.models.fake-model]
    context = 128000
    output = 4096

The key itself never lives in a config object: only the name of the variable
that holds it, read at the call (:meth:`ProviderConfig.api_key`), so a key set
after the server started is picked up and no repr or log of a config can leak it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import attrs

from actors.llm._errors import AuthenticationError
from protocol.shapes import ModelRef

__all__ = [
    "PROVIDER_KINDS",
    "ModelLimits",
    "ProviderConfig",
    "ProviderKind",
    "parse_model_ref",
    "parse_providers",
]

ProviderKind = Literal["openai", "anthropic"]
PROVIDER_KINDS: Final[tuple[ProviderKind, ...]] = ("openai", "anthropic")


@attrs.frozen(kw_only=True)
class ModelLimits:
    """A configured model's window and output cap, in tokens."""

    #: The context window, tokens: what compaction measures a request against.
    context: int = attrs.field(validator=attrs.validators.gt(0))
    #: The most output tokens a step may ask for.
    output: int = attrs.field(validator=attrs.validators.gt(0))


def _frozen_headers(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


def _frozen_models(value: Mapping[str, ModelLimits]) -> Mapping[str, ModelLimits]:
    return dict(value)


@attrs.frozen(kw_only=True)
class ProviderConfig:
    """One ``[providers.<id>]`` table."""

    #: The table's name: the provider half of ``PROVIDER/MODEL``.
    id: str
    #: The wire format: ``openai`` (Chat Completions) or ``anthropic`` (Messages).
    kind: ProviderKind = attrs.field(validator=attrs.validators.in_(PROVIDER_KINDS))
    #: openai: the API root (``http://127.0.0.1:8000/v1``); anthropic: the host
    #: root (``https://api.anthropic.com``).
    base_url: str
    #: The environment variable that holds the key, read at each call; never logged.
    api_key_env: str | None = None
    #: Extra HTTP headers sent with every request.
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_headers, repr=False)
    #: The models a session may choose, by id: ``[providers.ID.models.MODEL]``.
    models: Mapping[str, ModelLimits] = attrs.field(factory=dict, converter=_frozen_models)

    def api_key(self) -> str | None:
        """The key from ``api_key_env`` (None when no variable is configured).

        Raises :class:`~actors.llm.AuthenticationError` naming the variable
        when it is configured but unset: not retryable, and clearer than the
        provider's 401.
        """
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise AuthenticationError(
                f"provider {self.id!r}: the environment variable {self.api_key_env}"
                " that should hold its API key is not set"
            )
        return key

    def missing_key_variable(self) -> str | None:
        """The configured key variable when it is unset now (for a warning at start)."""
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            return self.api_key_env
        return None


def parse_model_ref(value: str) -> ModelRef:
    """``provider/model`` as a :class:`ModelRef` (the model id may contain ``/``)."""
    provider, slash, model = value.partition("/")
    if not slash or not provider or not model:
        raise ValueError(f"expected PROVIDER/MODEL, got {value!r}")
    return ModelRef(id=model, provider_id=provider)


_PROVIDER_KEYS: Final = {"kind", "base_url", "api_key_env", "headers", "models"}
_MODEL_KEYS: Final = {"context", "output"}


def parse_providers(table: Mapping[str, Any]) -> dict[str, ProviderConfig]:
    """The ``[providers]`` table as configs; raises ValueError saying what is wrong."""
    out: dict[str, ProviderConfig] = {}
    for provider_id, body in table.items():
        where = f"providers.{provider_id}"
        if provider_id == "scripted":
            raise ValueError(f"{where}: 'scripted' is the built-in provider's id")
        if not isinstance(body, Mapping):
            raise ValueError(f"[{where}] must be a table")
        unknown = set(body) - _PROVIDER_KEYS
        if unknown:
            raise ValueError(f"unknown key {where}.{sorted(unknown)[0]}")
        kind = body.get("kind")
        if kind not in PROVIDER_KINDS:
            raise ValueError(f"{where}.kind must be one of {', '.join(PROVIDER_KINDS)}")
        base_url = body.get("base_url")
        if not isinstance(base_url, str) or urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"{where}.base_url must be an http(s) URL")
        key_env = body.get("api_key_env")
        if key_env is not None and (not isinstance(key_env, str) or not key_env):
            raise ValueError(f"{where}.api_key_env must be a variable name")
        headers = body.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValueError(f"{where}.headers must be a table of strings")
        models = body.get("models", {})
        if not isinstance(models, Mapping):
            raise ValueError(f"[{where}.models] must be a table")
        out[provider_id] = ProviderConfig(
            id=provider_id,
            kind=kind,
            base_url=base_url,
            api_key_env=key_env,
            headers=headers,
            models={m: _model(f"{where}.models.{m}", v) for m, v in models.items()},
        )
    return out


def _model(where: str, body: Any) -> ModelLimits:
    if not isinstance(body, Mapping):
        raise ValueError(f"[{where}] must be a table")
    unknown = set(body) - _MODEL_KEYS
    if unknown:
        raise ValueError(f"unknown key {where}.{sorted(unknown)[0]}")
    values = {}
    for key in ("context", "output"):
        value = body.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}.{key} must be a positive integer")
        values[key] = value
    return ModelLimits(**values)
