"""The console in a real headless Chromium (Playwright), against a live server and real rows.

The browser signs in through the page's form with a bearer token, reads an actor's state, sees an
event arrive live after a command, watches a job's progress bar move and finish, and retries an
ambiguous dead letter only once its confirmation dialog is accepted; the test checks the durable
rows after each step. It also proves that data is rendered as text, never as markup, and that the
local console of ``akter dev`` works from the token in its URL's fragment, which the page takes out
of the address bar, and polls only while the tab is visible.

Chromium is Debian's ``/usr/bin/chromium`` (or
``$AKTER_CHROMIUM``); the test is skipped only when no such binary exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable

import pytest
from playwright.async_api import Browser, Dialog, Page, Request, expect

from akter.http.console import Console
from tests.e2e.browser import WAIT_MS
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

#: Where the docs' screenshot is written when this variable names a file (docs/console.png).
SCREENSHOT = os.environ.get("AKTER_CONSOLE_SCREENSHOT")


async def _eventually(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (at most ``WAIT_MS``)."""
    deadline = asyncio.get_running_loop().time() + WAIT_MS / 1000
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def console_page(
    browser: Browser, url: str, tab: str | None = "actors", *, bearer: str | None = None
) -> AsyncIterator[Page]:
    """A page on the console, signed in through the form (``bearer``: default the operator's).

    The console opens on its overview; ``tab`` (default the actors) is then clicked, unless
    ``None``. Closing the page ends its live feeds before the server stops (an open one would
    hold the server's graceful shutdown).
    """
    page = await browser.new_page(viewport={"width": 1500, "height": 900})
    try:
        await _sign_in(page, url, bearer or token(OPERATOR))
        if tab is not None:
            await page.click(f".tab[data-tab={tab}]")
            await page.locator(f"#tab-{tab}").wait_for(state="visible", timeout=WAIT_MS)
        yield page
    finally:
        await page.close()


async def _sign_in(page: Page, url: str, bearer: str) -> Page:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{url}/console")
    assert page.url == f"{url}/console/"
    login = page.locator("#login")
    await login.wait_for(state="visible", timeout=WAIT_MS)  # 401 without credentials
    await page.fill("#login-value", f"Bearer {bearer}")
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
            await expect(label).to_have_text("finished · succeeded", timeout=WAIT_MS)
            assert await bar.evaluate("b => b.value === b.max") is True
            await expect(row.locator(".job-status")).to_have_text("finished", timeout=WAIT_MS)
            # "finished" is the settle; the job's row is then its route intent (command id = job
            # id), which the relay delivers in its own time (a loaded machine: seconds later).
            deadline = asyncio.get_running_loop().time() + WAIT_MS / 1000
            while await t.rows(
                "SELECT 1 FROM {schema}.outbox WHERE intent_id = %(j)s", {"j": job_id}
            ):
                assert asyncio.get_running_loop().time() < deadline, "the route was not delivered"
                await asyncio.sleep(0.05)
            state_row = await t.inspect(t.get(Courier, "c-1"))
            assert state_row.state is not None and state_row.state["balance"] == 3

            # An ambiguous dead letter: shown as such, and retried only once confirmed.
            letter_id = await t.get(Courier, "c-2").ship("north")
            await t.drain()
            (letter,) = await t.rows("SELECT job_id FROM {schema}.dead_letters")
            assert letter["job_id"] == letter_id
            # As if the provider may have applied the call before the job died.
            await t.rows("UPDATE {schema}.dead_letters SET ambiguous = true")
            courier.fail = False
            await page.click(".tab[data-tab=letters]")
            await expect(page.locator("#count-letters")).to_have_text("1", timeout=WAIT_MS)
            letter_row = page.locator(f'#letters tr[data-job="{letter_id}"]')
            await expect(letter_row).to_contain_text("JobFailure: the depot is closed")
            await expect(letter_row).to_contain_text("may already have been applied")
            await expect(letter_row).to_have_class("ambiguous")
            dialogs: list[str] = []

            async def answer(dialog: Dialog, accept: bool) -> None:
                dialogs.append(dialog.message)
                await (dialog.accept() if accept else dialog.dismiss())

            # Dismissed: nothing happens.
            page.once("dialog", lambda dialog: answer(dialog, False))
            await letter_row.locator("button.retry").click()
            await _eventually(lambda: len(dialogs) == 1)
            assert "ambiguous" in dialogs[0] and "may already have applied" in dialogs[0]
            assert letter_id in dialogs[0]
            await page.wait_for_timeout(500)
            await expect(letter_row).to_have_count(1)
            assert [r["job_id"] for r in await t.rows("SELECT * FROM {schema}.dead_letters")] == [
                letter_id
            ]
            # Accepted: a new job runs and the letter is gone.
            page.once("dialog", lambda dialog: answer(dialog, True))
            await letter_row.locator("button.retry").click()
            await expect(letter_row).to_have_count(0, timeout=WAIT_MS)
            assert len(dialogs) == 2
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


async def test_the_local_console_with_its_token(
    served: Serve, browser: Browser, courier: CourierControl
) -> None:
    local = Console.local()
    assert local.token is not None
    async with served([*ACTORS, Courier], auth=None, app_options={"console": local}) as s:
        await s.t.get(Account, "a-1").deposit(3)
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            # Without the token: the page says how to get one; no sign-in form.
            await page.goto(f"{s.url}/console/")
            await expect(page.locator("#status")).to_contain_text("akter dev", timeout=WAIT_MS)
            assert await page.locator("#login").is_hidden()
            assert await page.locator("#types li").count() == 0

            await page.close()
            # With the URL akter dev prints: it works, and the token leaves the address bar.
            page = await browser.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{s.url}/console/#token={local.token}")
            account = page.locator("#types li[data-type=Account]")
            await expect(account).to_contain_text("1", timeout=WAIT_MS)
            assert page.url == f"{s.url}/console/"
            stored = await page.evaluate("sessionStorage.getItem('akter.console.token')")
            assert stored == local.token
            await page.click(".tab[data-tab=actors]")  # the console opens on its overview
            # The tab keeps it: a reload without the fragment still works (on the same tab).
            await page.reload()
            await expect(page.locator("#types li[data-type=Account]")).to_be_visible(
                timeout=WAIT_MS
            )

            # Polls are spaced, never overlap, and stop while the tab is hidden.
            polls: list[str] = []

            def seen(request: Request) -> None:
                if "/console/api/overview" in request.url:
                    polls.append(request.url)

            page.on("request", seen)
            await asyncio.sleep(4.5)
            assert 1 <= len(polls) <= 3, polls
            await page.evaluate(
                """() => {
                  Object.defineProperty(document, "visibilityState", {
                    configurable: true, get: () => "hidden" });
                  document.dispatchEvent(new Event("visibilitychange"));
                }"""
            )
            await asyncio.sleep(0.5)  # a poll already under way may end
            polls.clear()
            await asyncio.sleep(3)
            assert polls == []
            await page.evaluate(
                """() => {
                  Object.defineProperty(document, "visibilityState", {
                    configurable: true, get: () => "visible" });
                  document.dispatchEvent(new Event("visibilitychange"));
                }"""
            )
            await _eventually(lambda: len(polls) > 0)
            assert errors == []
        finally:
            await page.close()
