"""The environment a tool's subprocess gets: the server's, without its secrets.

A model can run ``env`` (or read ``/proc/self/environ``) in any shell it is
given, so whatever the server holds in its environment must not be inherited.
Removed:

- ``SESSIONRT_SERVER_PASSWORD``;
- every name the operator lists (``[runtime] secret_env``; provider key
  variables such as ``[providers.X] api_key_env`` belong there), and every
  name matching one of the operator's glob patterns (``[runtime]
  secret_env_patterns = ["VAULT_*", "*_PIN"]``, case-insensitive);
- by rule, any name that looks like a credential, case-insensitively: it
  contains ``PASSWORD``, ``PASSWD``, ``PASSPHRASE``, ``SECRET``, ``TOKEN``,
  ``CREDENTIAL`` (``CREDENTIALS`` too), ``PRIVATE``, ``API_KEY`` or ``APIKEY``;
  one of its words (split at ``_``, ``-``, ``.``) is ``PASS`` or starts with
  ``AUTH`` (``AUTH``, ``AUTHTOKEN``, ``AUTHORIZATION``; not ``AUTHOR``, so
  ``GIT_AUTHOR_NAME`` stays); or it ends in ``_KEY``, ``PASS`` or ``PWD``
  (``DB_PASS``, ``MYSQL_PWD``; the shell's own ``PWD`` and ``OLDPWD`` stay).

The rule errs on the side of removing: a tool that needs such a variable gets
it from a file in its Location, or from the session's environment
(``PUT …/environment``), not from the server's.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["PASSWORD_ENV", "is_secret", "split_secret_env", "tool_environment"]

#: The variable the server reads its password from (``server.cli``).
PASSWORD_ENV: Final = "SESSIONRT_SERVER_PASSWORD"
_MARKERS: Final = (
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "SECRET",
    "TOKEN",
    "CREDENTIAL",
    "PRIVATE",
    "API_KEY",
    "APIKEY",
)
_WORDS: Final = re.compile(r"[_\-.]+")
#: Names that end in PWD but are the shell's working directories.
_DIRECTORIES: Final = frozenset({"PWD", "OLDPWD"})
#: A ``secret_env`` entry with one of these is a glob pattern, not a name.
_GLOB: Final = frozenset("*?[")


def split_secret_env(entries: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """``entries`` as exact names and (upper-cased) glob patterns."""
    names, patterns = set(), []
    for entry in entries:
        if _GLOB.intersection(entry):
            patterns.append(entry.upper())
        else:
            names.add(entry)
    return frozenset(names), tuple(patterns)


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether ``name`` is withheld from tools (the rule above, plus ``extra``:
    names, and glob patterns such as ``VAULT_*`` from ``secret_env_patterns``)."""
    return _secret(name, *split_secret_env(extra))


def _secret(name: str, names: frozenset[str], patterns: tuple[str, ...]) -> bool:
    upper = name.upper()
    if upper == PASSWORD_ENV or name in names:
        return True
    if any(fnmatch.fnmatchcase(upper, p) for p in patterns):
        return True
    if any(marker in upper for marker in _MARKERS):
        return True
    if upper.endswith(("_KEY", "PASS")) or (upper.endswith("PWD") and upper not in _DIRECTORIES):
        return True
    return any(
        w == "PASS"
        or (w.startswith("AUTH") and not w.startswith("AUTHOR"))
        or w.startswith("AUTHORIZ")
        for w in _WORDS.split(upper)
    )


def tool_environment(
    base: Mapping[str, str] | None = None, *, secret_env: Iterable[str] = ()
) -> dict[str, str]:
    """``base`` (default: this process's environment) without the secrets.

    ``secret_env``: the operator's names and patterns (a pattern has ``*``, ``?`` or ``[``).
    """
    names, patterns = split_secret_env(secret_env)
    source = os.environ if base is None else base
    return {name: value for name, value in source.items() if not _secret(name, names, patterns)}
