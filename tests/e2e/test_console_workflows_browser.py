"""The console's workflow runs in a real headless Chromium (the workflows spec W4).

Under an actor the operator sees its runs with what a suspended one waits for, opens one, and
reads its step timeline and pending signals; a signal sent meanwhile shows up on the next poll,
and the run's end replaces its wake condition. Data is rendered as text. Skipped where no
Chromium exists (as every browser test).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.async_api import Browser, expect

from akter.http.console import Console
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import Serve, operators_only
from tests.e2e.test_console_browser import console_page
from tests.integration.workflow_actors import ALL, CALLS, PROVIDER, Order

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def counters() -> Iterator[None]:
    CALLS.clear()
    PROVIDER.reset()
    yield
    CALLS.clear()
    PROVIDER.reset()


async def test_an_actors_runs_with_their_timeline_and_signals(
    served: Serve, browser: Browser
) -> None:
    options = {"console": Console(allow=operators_only)}
    async with served(ALL, app_options=options) as s:
        t = s.t
        run = await t.get(Order, "o-1").compensating.start()
        await t.drain()
        engine = t.runtime.workflows
        await engine.signal_json(run.id, "Note", {"text": "<b>not</b> shipped"})
        async with console_page(browser, s.url) as page:
            await page.click("#types li[data-type=Order]")
            await page.click("#actors tbody tr[data-id=o-1]")
            row = page.locator(f'#actor-runs tr[data-run="{run.id}"]')
            await expect(row).to_contain_text("suspended", timeout=WAIT_MS)
            await expect(row).to_contain_text("signal Shipped")

            await row.click()
            steps = page.locator("#run-steps li")
            await expect(steps).to_have_count(2, timeout=WAIT_MS)
            await expect(steps.first).to_contain_text("command Order.mark")
            await expect(steps.nth(1)).to_contain_text("wait Shipped")
            await expect(steps.nth(1)).to_have_class("pending")
            facts = page.locator("#run-facts")
            # The run's deadline (its workflow timeout) caps the wait: it waits until then alone.
            await expect(facts.locator('dd[data-fact="waits for"]')).to_have_text(
                re.compile(r"^signal Shipped · until \S")
            )
            signals = page.locator("#run-signals tbody tr")
            await expect(signals).to_have_count(1)
            await expect(signals.first).to_contain_text("<b>not</b> shipped")
            assert await page.locator("#run-signals b").count() == 0  # text, not markup

            # The awaited signal: the run completes, and the page follows on its poll.
            await engine.signal_json(run.id, "Shipped", {"tracking": "T-1"})
            await t.drain()
            await expect(facts.locator("dd[data-fact=status]")).to_have_text(
                "completed", timeout=WAIT_MS
            )
            await expect(facts.locator("dd[data-fact=result]")).to_have_text('"shipped"')
            await expect(steps.nth(1)).to_have_class("done")
            await expect(row).to_contain_text("completed")
