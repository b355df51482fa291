"""``[mcp.<name>]`` tables: the MCP servers a runtime may start or reach.

::

    [mcp.files]
    command = ["python", "-m", "my_mcp_server"]   # stdio
    env = { "TOKEN_VAR" = "…" }                     # optional
    enabled = true                                  # optional, default true
    timeout_ms = 30000                              # optional, per call

    [mcp.docs]
    url = "http://127.0.0.1:9000/mcp"               # streamable HTTP
    headers = { "authorization" = "Bearer …" }      # optional

Exactly one of ``command`` and ``url``. ``env`` values and ``headers`` values
are secrets: they never appear in a repr, an event, an error or a log line
(the server's stderr is redacted of them before it is logged).

The project's ``.sessionrt/mcp.toml`` has the same shape and can only take
authority away (:func:`narrow_servers`): it may switch an operator's server
off and shorten its ``timeout_ms``; it cannot add servers or change how one
is started, since that would run a command the operator never configured.

Nothing here imports the MCP SDK.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "McpServerConfig",
    "narrow_servers",
    "parse_servers",
]

DEFAULT_TIMEOUT_MS: Final = 30_000
#: A server name: it prefixes its tools' names (``<server>_<tool>``), which
#: providers limit to ``[a-zA-Z0-9_-]``.
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$")
_KEYS: Final = frozenset({"command", "url", "env", "headers", "enabled", "timeout_ms"})


def _hidden(value: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k!r}: '…'" for k in value) + "}"


@attrs.frozen(kw_only=True)
class McpServerConfig:
    """One configured server. Equal configurations share a process per Location."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict, repr=_hidden, hash=False)
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=_hidden, hash=False)
    enabled: bool = True
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never be shown (env and header values), longest first."""
        values = {v for v in (*self.env.values(), *self.headers.values()) if len(v) >= 4}
        # A header like "Bearer xyz": its token alone is a secret too.
        values |= {part for v in self.headers.values() for part in v.split() if len(part) >= 8}
        return tuple(sorted(values, key=len, reverse=True))

    def key(self) -> tuple[Any, ...]:
        """What makes two configurations the same server (values included)."""
        return (
            self.name,
            self.command,
            self.url,
            tuple(sorted(self.env.items())),
            tuple(sorted(self.headers.items())),
            self.timeout_ms,
        )


def _strings(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{where} must be a table of strings")
    return dict(value)


def parse_server(name: str, table: object) -> McpServerConfig:
    """One ``[mcp.<name>]`` table, checked.

    Raises:
        ValueError: what is wrong (never quoting a value).
    """
    where = f"mcp.{name}"
    if not _NAME.fullmatch(name):
        raise ValueError(f"[{where}]: a server name is letters, digits and '-' (at most 32)")
    if not isinstance(table, dict):
        raise ValueError(f"[{where}] must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key {where}.{unknown[0]}")
    command, url = table.get("command"), table.get("url")
    if (command is None) == (url is None):
        raise ValueError(f"[{where}] needs exactly one of command (stdio) and url (HTTP)")
    if command is not None and (
        not isinstance(command, list)
        or not command
        or not all(isinstance(c, str) and c for c in command)
    ):
        raise ValueError(f"{where}.command must be a non-empty list of strings")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        raise ValueError(f"{where}.url must be an http:// or https:// URL")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}.enabled must be true or false")
    timeout = table.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"{where}.timeout_ms must be a positive integer")
    env = _strings(f"{where}.env", table.get("env", {}))
    headers = _strings(f"{where}.headers", table.get("headers", {}))
    if command is None and env:
        raise ValueError(f"{where}.env is for a stdio server (command)")
    if command is not None and headers:
        raise ValueError(f"{where}.headers is for an HTTP server (url)")
    return McpServerConfig(
        name=name,
        command=tuple(command or ()),
        url=url,
        env=env,
        headers=headers,
        enabled=enabled,
        timeout_ms=timeout,
    )


def parse_servers(section: object) -> dict[str, McpServerConfig]:
    """The ``[mcp]`` section: server configurations by name.

    Raises:
        ValueError: what is wrong.
    """
    if not isinstance(section, dict):
        raise ValueError("[mcp] must be a table of servers")
    return {name: parse_server(name, table) for name, table in section.items()}


def narrow_servers(
    operator: Mapping[str, McpServerConfig], project: object
) -> dict[str, McpServerConfig]:
    """The operator's servers as a project's ``[mcp]`` section narrows them.

    A project table may name only an operator's server, and only
    ``enabled`` (it can switch one off, not on) and ``timeout_ms`` (only
    shorter).

    Raises:
        ValueError: the project's section asks for more.
    """
    if not isinstance(project, dict):
        raise ValueError("[mcp] must be a table of servers")
    out = dict(operator)
    for name, table in project.items():
        base = operator.get(name)
        if base is None:
            raise ValueError(
                f"[mcp.{name}]: a project may only narrow a server the operator configured"
            )
        if not isinstance(table, dict) or set(table) - {"enabled", "timeout_ms"}:
            raise ValueError(f"[mcp.{name}]: a project may set only enabled and timeout_ms")
        enabled = table.get("enabled", True)
        timeout = table.get("timeout_ms", base.timeout_ms)
        if not isinstance(enabled, bool):
            raise ValueError(f"mcp.{name}.enabled must be true or false")
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise ValueError(f"mcp.{name}.timeout_ms must be a positive integer")
        out[name] = attrs.evolve(
            base, enabled=base.enabled and enabled, timeout_ms=min(base.timeout_ms, timeout)
        )
    return out
