"""The write-or-check ``main`` shared by the generators (gen_client, gen_config_doc).

Each generator renders its file's whole text; this writes it when it changed,
or with ``--check`` exits 1 when the committed file is stale (the freshness
tests call it that way).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(
    target: Path, render: Callable[[], str], *, script: str, doc: str | None, argv: list[str] | None
) -> int:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    ns = parser.parse_args(argv)
    text = render()
    current = target.read_text() if target.exists() else None
    if ns.check:
        if current != text:
            print(f"{target} is stale; run scripts/{script}", file=sys.stderr)
            return 1
        return 0
    if current != text:
        target.parent.mkdir(exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    return 0
