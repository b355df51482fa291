"""The browser and the screenshot folder every console test uses.

One Chromium per test process, started by the first console test there and
closed at the session's end: launching Playwright's driver and the browser cost
1.3 s of CPU, once per test before. Each test still gets pages of its own, each
in a fresh browser context (``Browser.new_page``: no cookies or storage shared),
and every context a test opened is closed after it. The browser lives on the
session's event loop, so the console tests and their async fixtures run there
(``CONSOLE_MARKS``, ``loop_scope="session"``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from console_pages import CHROMIUM


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def _chromium() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, driven by Playwright; closed at the session's end."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(loop_scope="session")
async def browser(_chromium: Any) -> AsyncIterator[Any]:
    """The process's browser; the contexts (and so pages) the test opened closed after it."""
    yield _chromium
    for context in list(_chromium.contexts):
        await context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: ``$SESSIONRT_TEST_OUTPUT``, else the test's tmp directory."""
    out = Path(os.environ.get("SESSIONRT_TEST_OUTPUT", tmp_path / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out
