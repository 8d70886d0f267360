"""The console's live reads in a real headless Chromium: values move without a reload.

An open actor follows its row's commits (a command that emits no event shows too, which the
event feed alone never showed), and an open job shows its output stream as the job streams it.
The page is never reloaded: a marker set on ``window`` before the commits is still there after.
The feeds belong to their tab: leaving the Actors tab closes the actor's, coming back opens them
again.
"""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from akter.http.console import Console
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import ACTORS, Account, Courier, CourierControl, Serve, operators_only
from tests.e2e.test_console_browser import console_page

pytestmark = pytest.mark.timeout(90)


async def test_state_and_job_output_update_live(
    served: Serve, browser: Browser, courier: CourierControl
) -> None:
    options = {"console": Console(allow=operators_only)}
    async with served([*ACTORS, Courier], app_options=options) as s:
        t = s.t
        account = t.get(Account, "a-1", tenant="acme")
        await account.deposit(30)
        async with console_page(browser, s.url) as page:
            await page.click("#types li[data-type=Account]")
            await page.click("#actors tbody tr[data-id=a-1]")
            state = page.locator("#actor-state")
            version = page.locator("#actor-facts dd[data-fact=version]")
            await expect(state).to_contain_text('"balance": 30', timeout=WAIT_MS)
            await expect(page.locator("#state-live")).to_be_visible(timeout=WAIT_MS)
            await page.evaluate("window.notReloaded = true")

            # A commit without an event: only the state feed can tell the page.
            assert await account.withdraw(5) == 25
            await expect(state).to_contain_text('"balance": 25', timeout=WAIT_MS)
            await expect(version).to_have_text("2")
            await expect(page.locator("#events li")).to_have_count(1)
            line = page.locator("#actors tbody tr[data-id=a-1] td")
            await expect(line.nth(2)).to_have_text("2")  # the open actor's line in the list
            assert await page.evaluate("window.notReloaded") is True

            # A job's output appears chunk by chunk, then its outcome.
            job_id = await t.get(Courier, "c-1", tenant="acme").haul(2)
            await page.click(".tab[data-tab=jobs]")
            await expect(page.locator("#state-live")).to_be_hidden()  # the actor's feeds closed
            row = page.locator(f'#jobs tr[data-job="{job_id}"]')
            await row.click(timeout=WAIT_MS)
            output = page.locator("#job-output")
            await expect(page.locator("#job-live")).to_be_visible(timeout=WAIT_MS)
            await expect(page.locator("#job-title")).to_contain_text(job_id)
            courier.permits.put_nowait(None)
            chunks = output.locator(".chunk")
            await expect(chunks).to_have_text(["leg 1 of 2"], timeout=WAIT_MS)
            await expect(output.locator(".attempt")).to_have_text(["attempt 1"])
            courier.permits.put_nowait(None)
            await expect(chunks).to_have_text(["leg 1 of 2", "leg 2 of 2"], timeout=WAIT_MS)
            outcome = page.locator("#job-outcome")
            await expect(outcome).to_have_text("finished · succeeded", timeout=WAIT_MS)
            await expect(page.locator("#job-live")).to_be_hidden()

            # Back on the Actors tab, the actor's feeds open again and follow the next commit.
            await page.click(".tab[data-tab=actors]")
            await expect(page.locator("#state-live")).to_be_visible(timeout=WAIT_MS)
            await account.withdraw(5)
            await expect(state).to_contain_text('"balance": 20', timeout=WAIT_MS)
            await expect(version).to_have_text("3")
            assert await page.evaluate("window.notReloaded") is True
