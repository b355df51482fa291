"""Dependencies point one way: protocol <- storage <- actors <- server."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

LAYERS = ["protocol", "storage", "actors", "server"]


@pytest.mark.parametrize("index", range(len(LAYERS)))
def test_a_layer_imports_nothing_above_it(index: int) -> None:
    package, above = LAYERS[index], LAYERS[index + 1 :]
    probe = (
        f"import sys, pkgutil, importlib, {package}\n"
        f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {above!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""


BACKENDS = ("storage.sqlite", "storage.postgres", "storage._writer")


@pytest.mark.parametrize("package", ["actors", "server"])
def test_actors_and_server_name_storage_protocols_never_a_backend(package: str) -> None:
    """Above ``storage`` only the Protocols and ``storage.connect`` may be named."""
    root = Path(__file__).resolve().parent.parent / package
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                bad += [f"{where} {a.name}" for a in node.names if a.name.startswith(BACKENDS)]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                if node.module.startswith(BACKENDS):
                    bad.append(f"{where} from {node.module}")
                bad += [
                    f"{where} {a.name}"
                    for a in node.names
                    if a.name in ("SQLiteStore", "PostgresStore", "sqlite", "postgres")
                ]
            elif isinstance(node, ast.Name | ast.Attribute):
                name = node.id if isinstance(node, ast.Name) else node.attr
                if name in ("SQLiteStore", "PostgresStore"):
                    bad.append(f"{where} {name}")
    assert bad == []
