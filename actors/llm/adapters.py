"""The configured providers as adapters: :func:`build_providers`."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from actors.llm._config import ProviderConfig
from actors.llm.anthropic import AnthropicProvider
from actors.llm.openai import OpenAIProvider

__all__ = ["HttpProvider", "build_providers"]

log = logging.getLogger(__name__)

HttpProvider = OpenAIProvider | AnthropicProvider


def build_providers(configs: Mapping[str, ProviderConfig]) -> dict[str, HttpProvider]:
    """One adapter per configuration; the caller owns them (``aclose`` each).

    A key variable that is configured but unset is only a warning here: the
    server may start before the key is provided, and the first call that
    needs it fails with an error naming the variable.
    """
    out: dict[str, HttpProvider] = {}
    for provider_id, config in configs.items():
        missing = config.missing_key_variable()
        if missing is not None:
            log.warning(
                "provider %s: the environment variable %s (its API key) is not set;"
                " calls to it will fail until it is",
                provider_id,
                missing,
            )
        if config.kind == "openai":
            out[provider_id] = OpenAIProvider(config)
        else:
            out[provider_id] = AnthropicProvider(config)
    return out
