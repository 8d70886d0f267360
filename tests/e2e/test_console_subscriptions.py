"""The console's subscriptions listing (the subscriptions spec): feeds with work, parked, lag."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from akter.http.console import Console
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import OPERATOR, Serve, operators_only, token
from tests.e2e.test_console_browser import console_page
from tests.integration.subscription_actors import FAILING, Order, Warehouse

pytestmark = pytest.mark.timeout(60)

HEADER = {"X-Akter-Console": "1"}


async def test_the_console_lists_subscriptions_with_their_pending_feeds(served: Serve) -> None:
    app = {"console": Console(allow=operators_only)}
    async with served([Order, Warehouse], app_options=app, relay=False) as s:
        FAILING.add("w-bad")
        try:
            await s.t.get(Order, "o-1").pay("w-bad")
            http = s.http(token(OPERATOR), headers=HEADER)
            response = await http.get("/console/api/subscriptions")
            assert response.status_code == 200
            (row,) = response.json()["subscriptions"]
            assert row["subscription"] == "Warehouse.on_order"
            assert row["subscriber_type"] == "Warehouse"
            assert (row["pending"], row["parked"]) == (1, 0)
            assert row["lag_ms"] >= 0
            anonymous = s.http(headers=HEADER)
            assert (await anonymous.get("/console/api/subscriptions")).status_code == 401
        finally:
            FAILING.clear()


async def test_the_subscriptions_tab_in_chromium(served: Serve, browser: Browser) -> None:
    app = {"console": Console(allow=operators_only)}
    async with served([Order, Warehouse], app_options=app, relay=False) as s:
        await s.t.get(Order, "o-1").pay("w-1")
        async with console_page(browser, s.url, "subscriptions") as page:
            row = page.locator("#subscriptions tbody tr[data-subscription='Warehouse.on_order']")
            await expect(row).to_contain_text("Warehouse", timeout=WAIT_MS)
            await expect(row.locator("td").nth(2)).to_have_text("1")
