"""Fixtures for these tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _hygiene(loop_hygiene: None) -> None:
    """Every test here runs under tests/conftest.py's loop_hygiene."""
