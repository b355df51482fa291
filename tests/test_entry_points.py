"""The suite runs from the ``pytest`` command too, not only ``python -m pytest``.

The ``pytest`` script does not put the working directory on ``sys.path``, and
``pythonpath`` puts ``tests/`` there, whose ``storage/``, ``actors/``, ... are
directories without ``__init__.py``: a bare namespace package that would
shadow the real one unless the checkout comes first (``pythonpath``'s ``"."``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTEST = Path(sys.executable).parent / "pytest"


@pytest.mark.skipif(not PYTEST.exists(), reason="no pytest script beside this Python")
def test_the_pytest_command_imports_the_packages_not_the_test_folders_of_the_same_name() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    done = subprocess.run(
        [
            str(PYTEST),
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/storage/test_clock.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_clock.py" in done.stdout
