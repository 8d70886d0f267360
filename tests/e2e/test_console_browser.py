"""The console in a real headless Chromium (Playwright), against a live server and real rows.

The browser signs in through the page's form with a bearer token, reads an actor's state, sees an
event arrive live after a command, watches a job's progress bar move and finish, and retries a
dead letter with a click; the test checks the durable rows after each step. It also proves that
data is rendered as text, never as markup. Chromium is Debian's ``/usr/bin/chromium`` (or
``$AKTER_CHROMIUM``); the test is skipped only when no such binary exists.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from akter.http.console import Console
from tests.e2e.conftest import (
    ACTORS,
    OPERATOR,
    Account,
    Courier,
    CourierControl,
    Serve,
    operators_only,
    token,
)

pytestmark = pytest.mark.timeout(90)

CHROMIUM = os.environ.get("AKTER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: Where the docs' screenshot is written when this variable names a file (docs/console.png).
SCREENSHOT = os.environ.get("AKTER_CONSOLE_SCREENSHOT")
WAIT_MS = 15_000


@pytest.fixture
def chromium() -> str:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium binary at {CHROMIUM} (set AKTER_CHROMIUM)")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # root cannot use Chromium's sandbox
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            yield launched
        finally:
            await launched.close()


@contextlib.asynccontextmanager
async def console_page(browser: Browser, url: str) -> AsyncIterator[Page]:
    """A page on the console, signed in as the operator through the form; closed after use.

    Closing it ends its live feeds before the server stops (an open one would hold the server's
    graceful shutdown).
    """
    page = await browser.new_page(viewport={"width": 1500, "height": 900})
    try:
        yield await _sign_in(page, url)
    finally:
        await page.close()


async def _sign_in(page: Page, url: str) -> Page:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{url}/console")
    assert page.url == f"{url}/console/"
    login = page.locator("#login")
    await login.wait_for(state="visible", timeout=WAIT_MS)  # 401 without credentials
    await page.fill("#login-value", f"Bearer {token(OPERATOR)}")
    await page.click("#login-submit")
    await login.wait_for(state="hidden", timeout=WAIT_MS)
    assert errors == []
    return page


async def test_console_in_chromium(
    served: Serve, browser: Browser, courier: CourierControl
) -> None:
    options = {"console": Console(allow=operators_only)}
    async with served([*ACTORS, Courier], app_options=options) as s:
        t = s.t
        account = t.get(Account, "a-1", tenant="acme")
        await account.deposit(30, "<img src=x onerror=alert(1)>")
        async with console_page(browser, s.url) as page:
            # An actor's state and events.
            await page.click("#types li[data-type=Account]")
            await page.click("#actors tbody tr[data-id=a-1]")
            state = page.locator("#actor-state")
            await expect(state).to_contain_text('"balance": 30', timeout=WAIT_MS)
            # Markup in the data is shown as text: no element was made from it.
            await expect(state).to_contain_text("<img src=x onerror=alert(1)>")
            assert await page.locator("#actor img").count() == 0
            await expect(page.locator("#actor-facts dd[data-fact=version]")).to_have_text("1")
            events = page.locator("#events li")
            await expect(events).to_have_count(1)
            await expect(page.locator("#events-live")).to_be_visible()

            # A command: its event arrives on the live feed, and the state follows.
            await account.deposit(12)
            await expect(events).to_have_count(2, timeout=WAIT_MS)
            await expect(events.first).to_contain_text("e2e.Deposited")
            await expect(events.first).to_contain_text('"balance":42')
            await expect(state).to_contain_text('"balance": 42', timeout=WAIT_MS)
            await expect(page.locator("#actor-facts dd[data-fact=version]")).to_have_text("2")
            if SCREENSHOT:
                await page.screenshot(path=SCREENSHOT, full_page=True)

            # A job's progress bar moves with its frames, then finishes.
            job_id = await t.get(Courier, "c-1").haul(3)
            await page.click(".tab[data-tab=jobs]")
            row = page.locator(f'#jobs tr[data-job="{job_id}"]')
            bar = row.locator("progress")
            label = row.locator(".progress-label")
            await expect(row).to_be_visible(timeout=WAIT_MS)
            for done in (1, 2):
                courier.permits.put_nowait(None)
                await expect(label).to_have_text(f"{done}/3 leg {done}", timeout=WAIT_MS)
                assert await bar.evaluate("b => [b.value, b.max]") == [done, 3]
            courier.permits.put_nowait(None)
            await expect(label).to_have_text("finished", timeout=WAIT_MS)
            assert await bar.evaluate("b => b.value === b.max") is True
            await expect(row.locator(".job-status")).to_have_text("finished", timeout=WAIT_MS)
            assert (
                await t.rows("SELECT * FROM {schema}.outbox WHERE intent_id = %(j)s", {"j": job_id})
                == []
            )
            state_row = await t.inspect(t.get(Courier, "c-1"))
            assert state_row.state is not None and state_row.state["balance"] == 3

            # A dead letter, retried by a click: a new job runs and the letter is gone.
            letter_id = await t.get(Courier, "c-2").ship("north")
            await t.drain()
            (letter,) = await t.rows("SELECT job_id FROM {schema}.dead_letters")
            assert letter["job_id"] == letter_id
            courier.fail = False
            await page.click(".tab[data-tab=letters]")
            await expect(page.locator("#count-letters")).to_have_text("1", timeout=WAIT_MS)
            letter_row = page.locator(f'#letters tr[data-job="{letter_id}"]')
            await expect(letter_row).to_contain_text("JobFailure: the depot is closed")
            await letter_row.locator("button.retry").click()
            await expect(letter_row).to_have_count(0, timeout=WAIT_MS)
            await expect(page.locator("#status")).to_contain_text(f"retried {letter_id}")
            assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
            await t.drain()
            delivered = await t.inspect(t.get(Courier, "c-2"))
            assert delivered.state is not None and delivered.state["memos"] == [
                "delivered to north"
            ]


async def test_a_refused_user_sees_the_refusal(served: Serve, browser: Browser) -> None:
    async with served(app_options={"console": Console(allow=operators_only)}) as s:
        page = await browser.new_page()
        try:
            await page.goto(f"{s.url}/console/")
            await page.locator("#login").wait_for(state="visible", timeout=WAIT_MS)
            await page.fill("#login-value", f"Bearer {token('bob')}")
            await page.click("#login-submit")
            await expect(page.locator("#login-error")).to_contain_text(
                "'bob' may not use the console", timeout=WAIT_MS
            )
            assert await page.locator("#types li").count() == 0
        finally:
            await page.close()
