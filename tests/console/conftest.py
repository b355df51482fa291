"""The browser and the screenshot folder every console test uses."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from console_pages import CHROMIUM


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, driven by Playwright; closed after the test."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: ``$SESSIONRT_TEST_OUTPUT``, else the test's tmp directory."""
    out = Path(os.environ.get("SESSIONRT_TEST_OUTPUT", tmp_path / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out
