"""The extras ``sessionrt serve ARGS`` needs, for scripts/serve: ``postgres``, ``mcp``, or nothing.

Standard library only: it runs on the system Python before .venv exists. The
runtime itself is always installed; an extra is added only when the arguments
(``--database URL``) or the ``--config`` file (``[runtime] database``) ask for
the PostgreSQL backend; ``mcp`` when the file configures ``[mcp.*]``
servers. A file it cannot read adds nothing: ``serve`` then says what is
wrong with it.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Sequence


def _is_postgres(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def _value(args: Sequence[str], flag: str) -> str | None:
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.partition("=")[2]
    return found


def extras(args: Sequence[str]) -> list[str]:
    """The extras of setup.cfg these ``serve`` arguments need."""
    database = _value(args, "--database")
    if database is None:
        config = _value(args, "--config")
        if config is not None:
            document = _read(config)
            runtime = document.get("runtime", {})
            if isinstance(runtime, dict):
                database = runtime.get("database")
    out = ["postgres"] if _is_postgres(database) else []
    config = _value(args, "--config")
    mcp = _read(config).get("mcp", {}) if config is not None else {}
    if isinstance(mcp, dict) and mcp:
        out.append("mcp")  # MCP servers: the official SDK
    return out


def _read(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


if __name__ == "__main__":
    print(",".join(extras(sys.argv[1:])))
