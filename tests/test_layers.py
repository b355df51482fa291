"""Dependencies point one way: protocol <- storage <- actors <- server."""

from __future__ import annotations

import subprocess
import sys

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
