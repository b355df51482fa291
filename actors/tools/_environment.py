"""The environment a tool's subprocess gets: the server's, without its secrets.

A model can run ``env`` (or read ``/proc/self/environ``) in any shell it is
given, so whatever the server holds in its environment must not be inherited.
Removed:

- ``SESSIONRT_SERVER_PASSWORD``;
- every name the operator lists (``[runtime] secret_env``; provider key
  variables such as ``[providers.X] api_key_env`` belong there);
- by rule, any name that looks like a credential, case-insensitively: it
  contains ``PASSWORD``, ``PASSWD``, ``SECRET``, ``TOKEN``, ``CREDENTIAL``,
  ``API_KEY`` or ``APIKEY``, or ends in ``_KEY`` (``OPENAI_API_KEY``,
  ``ANTHROPIC_API_KEY``, ``GITHUB_TOKEN``, ``AWS_SECRET_ACCESS_KEY`` …).

The rule errs on the side of removing: a tool that needs such a variable gets
it from a file in its Location, not from the server's environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["PASSWORD_ENV", "is_secret", "tool_environment"]

#: The variable the server reads its password from (``server.cli``).
PASSWORD_ENV: Final = "SESSIONRT_SERVER_PASSWORD"
_MARKERS: Final = ("PASSWORD", "PASSWD", "SECRET", "TOKEN", "CREDENTIAL", "API_KEY", "APIKEY")


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether ``name`` is withheld from tools (the rule above, plus ``extra`` names)."""
    upper = name.upper()
    if upper == PASSWORD_ENV or name in extra:
        return True
    return upper.endswith("_KEY") or any(marker in upper for marker in _MARKERS)


def tool_environment(
    base: Mapping[str, str] | None = None, *, secret_env: Iterable[str] = ()
) -> dict[str, str]:
    """``base`` (default: this process's environment) without the secrets."""
    extra = frozenset(secret_env)
    source = os.environ if base is None else base
    return {name: value for name, value in source.items() if not is_secret(name, extra)}
