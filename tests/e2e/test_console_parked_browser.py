"""The console's "Parked" tab in a real headless Chromium (evolution E3).

The operator sees a parked row with its cause, retries it (it parks again: its command is still
unknown), then discards it: the page asks for a reason, and a dismissed prompt changes nothing.
Skipped where no Chromium exists (as every browser test).
"""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, Dialog, expect

from akter.http.console import Console
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import ACTORS, Courier, Serve, operators_only
from tests.e2e.test_console_browser import console_page
from tests.e2e.test_console_parked import park_a_row, row

pytestmark = pytest.mark.timeout(90)


async def test_the_parked_tab_retries_and_discards_with_a_reason(
    served: Serve, browser: Browser
) -> None:
    options = {"console": Console(allow=operators_only)}
    async with served([*ACTORS, Courier], app_options=options) as s:
        row_id = await park_a_row(s.t)
        async with console_page(browser, s.url) as page:
            await page.click(".tab[data-tab=parked]")
            parked = page.locator(f'#parked tr[data-row="{row_id}"]')
            await expect(parked).to_contain_text("UnknownCommand: gone", timeout=WAIT_MS)

            await parked.locator("button.retry").click()
            await expect(page.locator("#status")).to_contain_text(f"retried {row_id}")

            async def dismiss(dialog: Dialog) -> None:
                await dialog.dismiss()

            page.once("dialog", dismiss)
            await parked.locator("button.discard").click()
            await page.wait_for_timeout(500)
            assert len(await row(s.t)) == 1  # no reason given: nothing discarded

            async def reason(dialog: Dialog) -> None:
                await dialog.accept("removed in v3")

            page.once("dialog", reason)
            await parked.locator("button.discard").click()
            await expect(parked).to_have_count(0, timeout=WAIT_MS)
            assert await row(s.t) == []
            [audit] = await s.t.rows("SELECT reason FROM {schema}.v_operator_audit")
            assert audit["reason"] == "removed in v3"
