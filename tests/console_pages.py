"""What the console's browser tests share: the password, the sign-in, a new session.

Playwright is imported only by the functions, so the conftest can read
:data:`CHROMIUM` where Playwright is not installed (the modules skip then).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

CHROMIUM: Final = "/usr/bin/chromium"
PASSWORD: Final = "console-pw"
#: The marks of every console test module (its ``pytestmark``).
CONSOLE_MARKS: Final = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium"),
    pytest.mark.timeout(120),
    pytest.mark.slow,  # a browser's pages: started first
    # On the loop of the process's one browser (tests/console/conftest.py).
    pytest.mark.asyncio(loop_scope="session"),
]


#: An init script that keeps each page's port to its (real) feed worker in
#: ``feedPorts``, so a test can hand the page a message of the worker's when it
#: chooses: ``feedPorts[0].onmessage({data: ...})``.
KEEP_FEED_PORT: Final = """
if (typeof SharedWorker === "function") {
  const Real = SharedWorker;
  self.feedPorts = [];
  self.SharedWorker = function (...args) {
    const worker = new Real(...args);
    self.feedPorts.push(worker.port);
    return worker;
  };
}
"""


async def signed_in(browser: Browser, url: str) -> Page:
    """A new page of the console at ``url``, signed in with :data:`PASSWORD`, its feed live."""
    page = await browser.new_page(viewport={"width": 1200, "height": 800})
    return await sign_in(page, url)


async def sign_in(page: Page, url: str) -> Page:
    """``page`` at the console at ``url``, signed in with :data:`PASSWORD`, its feed live."""
    from playwright.async_api import expect

    await page.goto(url + "/")
    dialog = page.locator("#auth")
    await expect(dialog).to_be_visible()
    await page.fill("#password", PASSWORD)
    await page.click("#auth-ok")
    await expect(dialog).to_be_hidden()
    await expect(page.locator("#feed-state.live")).to_be_visible()
    return page


async def create(page: Page, title: str) -> str:
    """Creates a session from the page; its id, once it is listed and open."""
    from playwright.async_api import expect

    await page.fill("#new-title", title)
    await page.click("#create")
    await expect(page.locator("#session-title")).to_have_text(title)
    sid = await page.locator("#session-id").text_content()
    assert sid is not None
    assert sid.startswith("ses_")
    await expect(page.locator(f'#sessions li[data-id="{sid}"]')).to_be_visible()
    return sid
