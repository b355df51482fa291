"""The ``sessionrt`` command line.

``sessionrt serve`` opens (creating if needed) the SQLite database in the data
directory and reports what it holds. The HTTP/SSE server that ``serve`` will
start is not built yet; until it is, ``serve`` stops after the report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from storage import SCHEMA_VERSION, SQLiteStore, StorageError

__all__ = ["default_data_dir", "main"]

DB_NAME = "sessionrt.sqlite"


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/sessionrt``, falling back to ``~/.local/share/sessionrt``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "sessionrt"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionrt", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="open the database and serve sessions")
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the database lives (default: $XDG_DATA_HOME/sessionrt)",
    )
    return parser


async def _serve(data_dir: Path) -> int:
    path = data_dir / DB_NAME
    async with SQLiteStore(path) as store:
        sessions = (await store.fetch("SELECT count(*) FROM session"))[0][0]
        events = (await store.fetch("SELECT count(*) FROM event"))[0][0]
        pending = (await store.fetch("SELECT count(*) FROM session_inbox"))[0][0]
    print(f"sessionrt: database {path}")
    print(f"  schema version {SCHEMA_VERSION}, synchronous=FULL, WAL")
    print(f"  {sessions} sessions, {events} events, {pending} pending inbox items")
    print("  the HTTP server is not built yet; nothing more to serve")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        data_dir = args.data_dir or default_data_dir()
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            return asyncio.run(_serve(data_dir))
        except (StorageError, OSError) as exc:
            print(f"sessionrt: {exc}", file=sys.stderr)
            return 1
    return 2  # pragma: no cover - argparse rejects unknown commands first


if __name__ == "__main__":
    sys.exit(main())
