"""The web console in a real browser: Debian's Chromium, headless, driven by Playwright.

The server is a real ``sessionrt serve`` subprocess with a password; the page
asks for it and uses it for every call and stream. Screenshots go to
``$SESSIONRT_TEST_OUTPUT`` (default: the test's tmp directory), never the
repository.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from serve_proc import serving

pytest.importorskip("playwright")
from console_pages import CONSOLE_MARKS, KEEP_FEED_PORT, PASSWORD, create, sign_in, signed_in
from playwright.async_api import Browser, Page, expect

pytestmark = CONSOLE_MARKS
#: A slow answer: 2 characters every 60 ms, long enough to watch, reload and interrupt.
SLOW_TEXT = "The quick brown fox jumps over the lazy dog. " * 4
SLOW = f"#reasoning thinking first\n#delay 60\n#chunk 2\n#text {SLOW_TEXT.strip()}"


@pytest_asyncio.fixture(loop_scope="session")  # the browser's loop
async def url(tmp_path: Path) -> AsyncIterator[str]:
    env = {**os.environ, "SESSIONRT_SERVER_PASSWORD": PASSWORD}
    async with serving(tmp_path / "data", env=env, cwd=tmp_path) as served:
        yield served.url


async def send(page: Page, text: str, delivery: str = "steer") -> None:
    await page.fill("#prompt", text)
    await page.select_option("#delivery", delivery)
    await page.click("#send")


async def log_seqs(page: Page) -> list[int]:
    cells = await page.locator("#log tbody td.seq").all_text_contents()
    return [int(c) for c in cells]


async def test_the_page_is_same_origin_and_needs_the_password_for_data(
    browser: Browser, url: str
) -> None:
    page = await browser.new_page()
    response = await page.goto(url + "/")
    assert response is not None
    assert response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    # Without the password the page can load, but no data: the API answers 401.
    status = await page.evaluate("fetch('/api/session').then(r => r.status)")
    assert status == 401
    await page.close()


async def test_create_prompt_stream_queue_and_interrupt(
    browser: Browser, url: str, shots: Path
) -> None:
    page = await signed_in(browser, url)
    await create(page, "first demo")
    await send(page, SLOW)
    transcript = page.locator("#transcript")
    await expect(transcript.locator(".msg.user")).to_have_count(1)
    streaming = transcript.locator(".msg.assistant .text.streaming")
    await expect(streaming).to_be_visible()  # the answer is streaming in
    partial = await streaming.text_content() or ""
    assert 0 < len(partial) < len(SLOW_TEXT.strip())
    await expect(page.locator("#session-status")).to_have_text("running")
    await expect(transcript.locator(".msg.assistant .reasoning")).to_have_text("thinking first")
    # A second prompt, queued: pending while the first runs, then delivered.
    await send(page, "#text second answer", "queue")
    pending = page.locator("#inbox li")
    await expect(pending).to_have_count(1)
    await expect(pending.first).to_have_attribute("data-delivery", "queue")
    await page.screenshot(path=shots / "streaming-with-pending.png")
    final = transcript.locator(".msg.assistant .text", has_text=SLOW_TEXT.strip())
    await expect(final).to_have_count(1, timeout=30_000)
    await expect(
        transcript.locator(".msg.assistant .text", has_text="second answer")
    ).to_have_count(1, timeout=30_000)
    await expect(pending).to_have_count(0)
    await expect(page.locator("#inbox-box")).to_be_hidden()
    await expect(page.locator("#session-status")).to_have_text("idle")
    await expect(transcript.locator(".cost").first).to_contain_text("tokens in")
    # Interrupt a slow run: the status goes back to idle with the run cut short.
    await send(page, SLOW)
    await expect(page.locator("#session-status")).to_have_text("running")
    await expect(transcript.locator(".msg.assistant .text.streaming")).to_be_visible()
    await page.click("#interrupt")
    await expect(page.locator("#session-status")).to_have_text("idle")
    await page.click("#tab-log")
    await expect(
        page.locator("#log td.type", has_text="session.execution.interrupted")
    ).to_have_count(1)
    await page.screenshot(path=shots / "log-after-interrupt.png")
    await page.close()


#: A run that holds at a tool call until the test makes the file ``release``
#: in the server's directory, then takes a second step.
HELD = "\n".join(
    [
        '#tool bash {"command": "while [ ! -e release ]; do sleep 0.05; done; printf released"}',
        "#step",
        "#text let go",
    ]
)


async def test_pending_items_can_change_delivery_and_be_cancelled(
    browser: Browser, url: str, tmp_path: Path
) -> None:
    # The run holds until the file exists, so the pending items stay pending
    # however slow the machine: nothing is delivered before the test says so.
    page = await signed_in(browser, url)
    await create(page, "inbox")
    await send(page, HELD)
    await expect(page.locator("#session-status")).to_have_text("running")
    await expect(page.locator("#transcript details.tool.running")).to_have_count(1)
    await send(page, "#text one", "queue")
    await send(page, "#text two", "queue")
    items = page.locator("#inbox li")
    await expect(items).to_have_count(2)
    # Sent one after the other, they are pending in that order.
    await expect(items.locator(".text")).to_have_text(["#text one", "#text two"])
    await items.nth(1).locator("button.cancel").click()
    await expect(items).to_have_count(1)
    await expect(items.first.locator(".text")).to_have_text("#text one")
    await items.first.locator("button.change").click()  # queue -> steer
    await expect(items.first).to_have_attribute("data-delivery", "steer")
    (tmp_path / "release").touch()
    await expect(items).to_have_count(0, timeout=30_000)  # a steer is taken at the next step
    await expect(page.locator("#transcript .msg.user", has_text="#text one")).to_have_count(1)
    await expect(page.locator("#transcript .msg.user", has_text="#text two")).to_have_count(0)
    await expect(page.locator("#session-status")).to_have_text("idle", timeout=30_000)
    await page.close()


async def test_reload_mid_stream_shows_no_gap_and_no_duplicate(
    browser: Browser, url: str, shots: Path
) -> None:
    page = await signed_in(browser, url)
    sid = await create(page, "reload")
    await send(page, SLOW)
    await expect(page.locator("#transcript .msg.assistant .text.streaming")).to_be_visible()
    await page.reload()
    # The password stays for the tab; the session re-opens from the URL's hash.
    assert page.url.endswith("#" + sid)
    await expect(page.locator("#session-id")).to_have_text(sid)
    await page.click("#tab-log")
    done = page.locator("#log td.type", has_text="session.execution.succeeded")
    await expect(done).to_have_count(1, timeout=30_000)
    seqs = await log_seqs(page)
    assert seqs == list(range(1, len(seqs) + 1))  # every seq once, none missing
    await page.click("#tab-transcript")
    answers = page.locator("#transcript .msg.assistant .text")
    await expect(answers).to_have_count(1)
    await expect(answers).to_have_text(SLOW_TEXT.strip())
    await expect(page.locator("#transcript .msg.user")).to_have_count(1)
    await page.screenshot(path=shots / "after-reload.png")
    # The log follow resumes without a gap after its stream is cut: turn follow
    # off, let the session move on, turn it back on.
    await page.click("#tab-log")
    await page.uncheck("#follow")
    await page.evaluate(
        """([sid, pw]) => fetch(`/api/session/${sid}/prompt`, {method: 'POST',
        headers: {'Content-Type': 'application/json', Authorization: 'Bearer ' + pw},
        body: JSON.stringify({text: '#text more'})})""",
        [sid, PASSWORD],
    )
    await page.check("#follow")
    await expect(done).to_have_count(2, timeout=30_000)
    seqs = await log_seqs(page)
    assert seqs == list(range(1, len(seqs) + 1))
    await page.close()


async def test_sessions_list_search_and_unread(browser: Browser, url: str, shots: Path) -> None:
    page = await signed_in(browser, url)
    first = await create(page, "alpha project")
    second = await create(page, "beta project")
    # Activity in a session not on screen marks it unread in the list.
    await page.evaluate(
        """([sid, pw]) => fetch(`/api/session/${sid}/prompt`, {method: 'POST',
        headers: {'Content-Type': 'application/json', Authorization: 'Bearer ' + pw},
        body: JSON.stringify({text: '#text hi'})})""",
        [first, PASSWORD],
    )
    await expect(page.locator(f'#sessions li[data-id="{first}"].unread')).to_be_visible()
    await expect(page.locator(f'#sessions li[data-id="{second}"].current')).to_be_visible()
    await page.fill("#search", "alpha")
    await expect(page.locator("#sessions li")).to_have_count(1)
    await expect(page.locator("#sessions li .title")).to_have_text(re.compile("alpha"))
    await page.screenshot(path=shots / "search.png")
    await page.locator(f'#sessions li[data-id="{first}"]').click()
    await expect(page.locator(f'#sessions li[data-id="{first}"].unread')).to_have_count(0)
    await page.close()


async def test_a_retry_shows_its_countdown_then_the_answer(browser: Browser, url: str) -> None:
    page = await signed_in(browser, url)
    await create(page, "retry")
    await send(page, "#fail rate-limit retry-after=4000 once\n#text recovered")
    await expect(page.locator("#session-status")).to_have_text("retrying")
    await expect(page.locator("#retry")).to_have_text(re.compile(r"retry in [1-4] s"))
    await expect(page.locator("#transcript .msg.assistant .text")).to_have_text(
        "recovered", timeout=30_000
    )
    await expect(page.locator("#retry")).to_be_hidden()
    await page.close()


async def test_many_tabs_of_one_browser_all_work(browser: Browser, url: str) -> None:
    # A browser gives an origin six connections; each tab holds one stream only.
    context = await browser.new_context()
    await context.add_init_script(f"sessionStorage.setItem('sessionrt.password', '{PASSWORD}')")
    pages = []
    for _ in range(8):
        page = await context.new_page()
        await page.goto(url + "/")
        await expect(page.locator("#feed-state.live")).to_be_visible()
        pages.append(page)
    sid = await create(pages[-1], "seen everywhere")
    await send(pages[-1], "#text hello tabs")
    await expect(pages[-1].locator("#transcript .msg.assistant .text")).to_have_text("hello tabs")
    for page in pages[:-1]:
        await expect(page.locator(f'#sessions li[data-id="{sid}"]')).to_be_visible()
    await context.close()


async def test_the_feeds_late_ask_for_a_password_leaves_a_signed_in_tab_alone(
    browser: Browser, url: str
) -> None:
    """The feed's worker asks the tabs for the password when its stream gets a 401.
    Its first call goes out before the sign-in; on a loaded machine its 401 can
    come back after it, and the tab then opened the dialog again, empty, over a
    console that was signed in (the sign-in of a test failed so, now and then).
    That ask names the password refused (none): the tab asks again only when
    the refused one is its own."""
    context = await browser.new_context()
    await context.add_init_script(KEEP_FEED_PORT)
    page = await sign_in(await context.new_page(), url)
    dialog = page.locator("#auth")
    ask = "(tried) => feedPorts[0].onmessage({ data: { auth: true, tried } })"
    # The handler runs in the evaluate: a dialog it opened is open when that returns.
    await page.evaluate(ask, None)  # the ask for the call made without a password
    assert not await dialog.is_visible()
    await expect(page.locator("#feed-state.live")).to_be_visible()
    await page.evaluate(ask, PASSWORD)  # this very password refused: asked again
    await expect(dialog).to_be_visible()
    await context.close()


async def test_a_long_session_opens_at_its_end_and_loads_earlier_messages(
    browser: Browser, url: str
) -> None:
    page = await signed_in(browser, url)
    sid = await create(page, "long")
    # 20 prompts with answers: 40 messages, more than the first page holds.
    await page.evaluate(
        """async ([sid, pw]) => {
        const h = {'Content-Type': 'application/json', Authorization: 'Bearer ' + pw};
        for (let i = 0; i < 20; i++) {
          await fetch(`/api/session/${sid}/prompt`, {method: 'POST', headers: h,
            body: JSON.stringify({text: '#text answer ' + i})});
          await fetch(`/api/experimental/session/${sid}/wait`, {method: 'POST', headers: h});
        }}""",
        [sid, PASSWORD],
    )
    await page.reload()
    await expect(page.locator("#session-id")).to_have_text(sid)
    messages = page.locator("#transcript .msg")
    await expect(messages.last).to_contain_text("answer 19")
    first_count = await messages.count()
    assert first_count < 40
    await page.click("#older")
    await expect(page.locator("#older")).to_be_hidden()
    await expect(messages).to_have_count(40)
    await expect(messages.first).to_contain_text("#text answer 0")
    seqs = [int(s) for s in await messages.evaluate_all("ns => ns.map(n => n.dataset.seq)")]
    assert seqs == sorted(seqs)
    await page.close()


#: An agent whose every bash call waits for a person's answer.
ASKER = '[agents.asker.permissions]\nbash = "ask"\n'


@pytest_asyncio.fixture(loop_scope="session")  # the browser's loop
async def asker_url(tmp_path: Path) -> AsyncIterator[str]:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "agents.toml").write_text(ASKER)
    env = {**os.environ, "SESSIONRT_SERVER_PASSWORD": PASSWORD}
    async with serving(data, env=env, cwd=tmp_path) as served:
        yield served.url


async def test_a_permission_ask_is_answered_in_the_page_and_the_call_runs(
    browser: Browser, asker_url: str, shots: Path
) -> None:
    page = await signed_in(browser, asker_url)
    sid = await page.evaluate(
        """async (pw) => {
        const r = await fetch('/api/session', {method: 'POST', headers:
          {'Content-Type': 'application/json', Authorization: 'Bearer ' + pw},
          body: JSON.stringify({title: 'asks', agent: 'asker'})});
        return (await r.json()).data.id;}""",
        PASSWORD,
    )
    await page.locator(f'#sessions li[data-id="{sid}"]').click()
    await expect(page.locator("#session-id")).to_have_text(sid)
    script = "\n".join(
        [
            '#tool bash {"command": "printf first-%s ran"}',
            "#step",
            '#tool bash {"command": "printf second-%s ran"}',
            "#step",
            "#text all done",
        ]
    )
    await send(page, script)
    transcript = page.locator("#transcript")
    # The ask stands on the tool call it holds; nothing has run.
    ask = transcript.locator(".msg.assistant .ask")
    await expect(ask).to_have_count(1)
    await expect(ask).to_contain_text("printf first-%s ran")
    call = transcript.locator("details.tool").first
    await expect(call).to_have_class(re.compile(r"\brunning\b"))
    assert await call.get_attribute("data-call") == await ask.get_attribute("data-call")
    await page.screenshot(path=shots / "permission-ask.png")
    await ask.locator("button.once").click()
    first = transcript.locator("details.tool.completed", has_text="first-ran")
    await expect(first).to_have_count(1)
    # The second call asks again (once granted only the first); reject it.
    await expect(ask).to_have_count(1)
    await expect(ask).to_contain_text("printf second-%s ran")
    await ask.locator("button.reject").click()
    await expect(transcript.locator("details.tool.error")).to_have_count(1)
    await expect(transcript.locator(".msg.assistant .text", has_text="all done")).to_have_count(1)
    await expect(ask).to_have_count(0)
    await expect(page.locator("#asks-box")).to_be_hidden()
    await expect(page.locator("#session-status")).to_have_text("idle")
    await page.click("#tab-log")
    replies = page.locator("#log td.type", has_text="session.permission.replied")
    await expect(replies).to_have_count(2)
    await page.close()


async def test_a_compaction_row_shows_its_summary_collapsed(browser: Browser, url: str) -> None:
    page = await signed_in(browser, url)
    await create(page, "compacted")
    transcript = page.locator("#transcript")
    # Two exchanges: the older one is what a compaction summarizes.
    await send(page, "#summary ## Objective\n#summary Keep the tests green.\n#text first answer")
    await expect(transcript.locator(".msg.assistant .text")).to_have_text("first answer")
    await expect(page.locator("#session-status")).to_have_text("idle")
    await send(page, "#text noted")
    await expect(transcript.locator(".msg.assistant .text").last).to_have_text("noted")
    await expect(page.locator("#session-status")).to_have_text("idle")
    await page.click("#compact")
    row = transcript.locator(".msg.compaction")
    await expect(row).to_have_attribute("data-status", "completed", timeout=30_000)
    await expect(row.locator(".compaction-head")).to_contain_text("manual")
    summary = row.locator("details.summary")
    body = summary.locator("pre")
    await expect(body).to_be_hidden()  # collapsed until opened
    await summary.locator("summary").click()
    await expect(body).to_contain_text("Keep the tests green.")
    # After the boundary the row stays where it was, below the answer it summarized.
    seqs = [
        int(s)
        for s in await transcript.locator(".msg").evaluate_all("ns => ns.map(n => n.dataset.seq)")
    ]
    assert seqs == sorted(seqs)
    await page.close()


async def test_a_user_shell_row_shows_its_command_and_output(browser: Browser, url: str) -> None:
    page = await signed_in(browser, url)
    sid = await create(page, "shell")
    status = await page.evaluate(
        """([sid, pw]) => fetch(`/api/session/${sid}/shell`, {method: 'POST',
        headers: {'Content-Type': 'application/json', Authorization: 'Bearer ' + pw},
        body: JSON.stringify({command: 'printf shell-%s said'})}).then(r => r.status)""",
        [sid, PASSWORD],
    )
    assert status == 204
    row = page.locator("#transcript .msg.shell")
    await expect(row).to_have_attribute("data-state", "completed", timeout=30_000)
    await expect(row.locator(".shell-head")).to_contain_text("$ printf shell-%s said")
    await expect(row.locator("pre")).to_have_text("shell-said")
    await page.close()
