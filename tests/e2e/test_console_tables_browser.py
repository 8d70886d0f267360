"""The console's Tables view in Chromium: an operator reads one tenant's owned rows, read-only.

The page lists the owned tables, reads the rows of the tenant typed in (the console sees every
tenant, one at a time), filters on a column, pages with "More", and shows a refused filter's
reason; a value holding markup is shown as text.
"""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from akter.http.console import Console
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import ACTORS, Serve, operators_only
from tests.e2e.shelf import SHELF_SCHEMA, Shelf
from tests.e2e.test_console_browser import console_page

pytestmark = pytest.mark.timeout(90)


async def test_the_tables_view_reads_a_tenants_rows(
    served: Serve, browser: Browser, shelf: None
) -> None:
    options = {"console": Console(allow=operators_only)}
    async with served([*ACTORS, Shelf], app_options=options) as s:
        mine = s.t.get(Shelf, "s-1", tenant="acme")
        for sku in ("apple", "<b>pear</b>", "plum"):
            await mine.stock(sku)
        await s.t.get(Shelf, "s-9", tenant="globex").stock("theirs")
        async with console_page(browser, s.url, "tables") as page:
            select = page.locator("#tables-table")
            await expect(select.locator("option")).to_have_count(1, timeout=WAIT_MS)
            await expect(select).to_have_value(f"{SHELF_SCHEMA}.shelf_items")
            await page.fill("#tables-tenant", "acme")
            await page.click("#tables-read")
            rows = page.locator("#tables-rows tbody tr")
            await expect(rows).to_have_count(3, timeout=WAIT_MS)
            await expect(page.locator("#tables-rows")).not_to_contain_text("theirs")
            await expect(rows.nth(1)).to_contain_text("<b>pear</b>")  # text, not markup
            assert await page.locator("#tables-rows b").count() == 0
            await expect(page.locator("#tables-more")).to_be_hidden()
            # a filter on a column
            await page.fill("#tables-filters input[data-column=sku]", "plum")
            await page.click("#tables-read")
            await expect(rows).to_have_count(1, timeout=WAIT_MS)
            await expect(rows.first).to_contain_text("plum")
            # a bad filter: the reason is shown, nothing else changes
            await page.fill("#tables-filters input[data-column=sku]", "")
            await page.fill("#tables-filters input[data-column=slot]", "two")
            await page.click("#tables-read")
            await expect(page.locator("#status")).to_contain_text("slot", timeout=WAIT_MS)
            await expect(rows).to_have_count(1)
            # the other tenant, typed in: only its rows
            await page.fill("#tables-filters input[data-column=slot]", "")
            await page.fill("#tables-tenant", "globex")
            await page.click("#tables-read")
            await expect(rows).to_have_count(1, timeout=WAIT_MS)
            await expect(rows.first).to_contain_text("theirs")
