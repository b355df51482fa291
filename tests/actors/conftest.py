"""Guards for every actor test: no task left behind, nothing reported to the loop.

Leaked tasks and "exception was never retrieved" are exactly the bugs an actor
core can have without any assertion failing, so every test checks for them.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene."""
