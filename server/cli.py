"""The ``sessionrt`` command line.

``sessionrt serve`` starts the HTTP/SSE server on the embedded defaults: the
SQLite database in the data directory (``$XDG_DATA_HOME/sessionrt``), the
built-in scripted model, loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from actors.runtime import RuntimeConfig
from server.app import ServerSettings
from server.serve import serve
from storage import StorageError

__all__ = ["default_data_dir", "main"]


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/sessionrt``, falling back to ``~/.local/share/sessionrt``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "sessionrt"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionrt", description=__doc__.split("\n")[2])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP/SSE server")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=4096, help="port (default 4096; 0 = any)")
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the database lives (default: $XDG_DATA_HOME/sessionrt)",
    )
    serve.add_argument(
        "--password",
        default=os.environ.get("SESSIONRT_SERVER_PASSWORD"),
        help="require this password (Basic or Bearer); default $SESSIONRT_SERVER_PASSWORD",
    )
    serve.add_argument(
        "--synchronous", choices=["FULL", "NORMAL"], default="FULL", help="SQLite durability"
    )
    return parser


def _serve(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    config = RuntimeConfig(data_dir=data_dir, synchronous=args.synchronous)
    settings = ServerSettings(password=args.password or None)
    asyncio.run(serve(config, settings, host=args.host, port=args.port))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
    except (StorageError, OSError) as exc:
        print(f"sessionrt: {exc}", file=sys.stderr)
        return 1
    return 2  # pragma: no cover - argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
