"""The console's overview charts and its workflows tab in a real headless Chromium.

The overview is the first screen: its charts draw the runtime's own history (real turns, jobs
and workflow runs, recorded on a compressed clock: one point per drain instead of every 15 s).
The workflows tab lists runs across actors, filters them, shows a run's step timeline, and
signals and cancels runs; another tenant's run is filtered out, and a user the console's rule
refuses sees no run. Each test writes its screenshot (docs/console-overview.png,
docs/console-workflows.png when ``AKTER_CONSOLE_SCREENSHOTS=docs``; else a temporary directory).
Skipped where no Chromium exists (as every browser test).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Dialog, expect

from akter._engine.history import History
from akter.http.console import Console
from akter.telemetry import Metrics
from akter.testing import ActorTest
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import OPERATOR, Account, Serve, token
from tests.e2e.test_console_browser import console_page
from tests.integration.workflow_actors import ALL, CALLS, PROVIDER, Order, Stock

pytestmark = pytest.mark.timeout(120)

#: The directory the screenshots go to (the docs: ``AKTER_CONSOLE_SCREENSHOTS=docs``).
SCREENSHOTS = os.environ.get("AKTER_CONSOLE_SCREENSHOTS")


def operators(caller: object, tenant: str) -> bool:
    """The console's operators: the ``ops`` tenant's OPERATOR (docs/console.md)."""
    return getattr(caller, "subject", None) == OPERATOR and tenant == "ops"


APP = {"console": Console(allow=operators)}
OPS = token(OPERATOR, "ops")
#: Points of traffic drawn on the overview (15 s apart on the history's clock: 30 minutes).
STEPS = 120


@pytest.fixture(autouse=True)
def counters() -> Iterator[None]:
    CALLS.clear()
    PROVIDER.reset()
    yield
    CALLS.clear()
    PROVIDER.reset()


def shot(tmp_path: Path, name: str) -> Path:
    return Path(SCREENSHOTS or tmp_path) / name


async def traffic(t: ActorTest, steps: int) -> History:
    """Real work recorded into a fresh history, one point per step, 15 s apart on its clock."""
    await t.runtime.history.stop()
    wall = [int(time.time() * 1000) - steps * 15_000]
    history = History(t.runtime.metrics, wall=lambda: wall[0])
    t.runtime.history = history
    history.record()
    for step in range(steps):
        wave = 2 + (step * 7) % 5 + step % 3  # a load that rises and falls
        for n in range(wave):
            order = t.get(Order, f"o-{step}-{n}", tenant="acme")
            await order.mark("hello")
            if n % 2 == 0:
                await order.paid.start(100 + n)  # a job
            if step % 6 == 0 and n == 0:
                await order.compensating.start()  # stays suspended, waiting for Shipped
            if step % 9 == 4 and n == 0:
                await order.failing.start()
            if n % 3 == 1:
                await t.get(Account, f"a-{n}", tenant="acme").send_letter("north")  # a job row
        # The $maintenance owner's gauges, sampled while the step's work waits in the outbox.
        await t.runtime._runners.sampler.sample()
        await t.drain()
        wall[0] += 15_000
        history.record()
    return history


async def test_the_overview_is_the_first_screen_with_the_last_hours_charts(
    served: Serve, browser: Browser, tmp_path: Path
) -> None:
    async with served([*ALL, Account], app_options=APP, relay=False) as s:
        history = await traffic(s.t, STEPS)
        points = history.series()
        assert len(points) == STEPS and sum(p["jobs"]["succeeded"] for p in points) > 0
        async with console_page(browser, s.url, tab=None, bearer=OPS) as page:
            overview = page.locator("#tab-overview")
            await expect(overview).to_be_visible(timeout=WAIT_MS)
            assert await page.locator("#tab-actors").is_hidden()
            for chart in ("commits", "lag", "backlog", "jobs", "workflows"):
                figure = page.locator(f"#chart-{chart}")
                await expect(figure).to_have_attribute("data-points", str(STEPS), timeout=WAIT_MS)
                await expect(figure.locator("svg")).to_have_count(1)
            commits = page.locator("#chart-commits path[data-series='commits/s']")
            await expect(commits).to_have_count(1)
            assert (await commits.get_attribute("d") or "").count("L") == STEPS - 1  # no gap
            assert await page.locator("#chart-jobs rect[data-series=succeeded]").count() > 10
            assert await page.locator("#chart-workflows rect[data-series=failed]").count() > 0
            await expect(
                page.locator("#chart-workflows path[data-series=suspended]")
            ).to_have_count(1)
            await expect(page.locator("#chart-workflows .legend")).to_contain_text("suspended 20")
            await expect(page.locator("#tile-actors")).not_to_be_empty()
            await expect(page.locator("#overview-note")).to_have_text("")
            path = shot(tmp_path, "console-overview.png")
            await page.screenshot(path=str(path), full_page=True)
            assert path.stat().st_size > 10_000


async def test_the_overview_says_when_this_runner_samples_no_gauges(
    served: Serve, browser: Browser
) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        # What a runner that does not own $maintenance records: its counters, no gauges.
        await s.t.runtime.history.stop()
        metrics = Metrics(["Order"])
        history = History(metrics)
        s.t.runtime.history = history
        history.record()
        metrics.count("akter.receipts.written", 5, actor_type="Order")
        history.record()
        async with console_page(browser, s.url, tab=None, bearer=OPS) as page:
            note = page.locator("#chart-lag .empty")
            await expect(note).to_contain_text("$maintenance owner", timeout=WAIT_MS)
            await expect(page.locator("#chart-lag path")).to_have_count(0)
            await expect(page.locator("#chart-commits path")).to_have_count(1)
            await expect(page.locator("#overview-note")).to_contain_text("Not sampled")


async def test_the_workflows_tab_lists_filters_and_operates_runs(
    served: Serve, browser: Browser, tmp_path: Path
) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        t = s.t
        done = await t.get(Order, "o-1", tenant="acme").three.start("sku-1")
        shipped = await t.get(Order, "o-2", tenant="acme").compensating.start()
        stopped = await t.get(Order, "o-3", tenant="acme").compensating.start()
        failed = await t.get(Order, "o-4", tenant="acme").failing.start()
        theirs = await t.get(Order, "o-9", tenant="beta").compensating.start()
        waiting = await t.get(Order, "o-5", tenant="acme").fulfil.start("sku-2", 1200)
        await t.drain()
        assert await t.get(Stock, "sku-1", tenant="acme").left() == 2
        async with console_page(browser, s.url, "workflows", bearer=OPS) as page:
            dialogs: list[str] = []

            async def accept(dialog: Dialog) -> None:
                dialogs.append(dialog.message)
                await dialog.accept()

            page.on("dialog", accept)
            rows = page.locator("#runs tbody tr")
            await expect(rows).to_have_count(6, timeout=WAIT_MS)
            row = page.locator(f'#runs tr[data-run="{failed.id}"]')
            await expect(row.locator(".run-status")).to_have_text("failed")

            # Filters: by status, by workflow, by tenant (another tenant's run leaves the list).
            await page.select_option("#runs-status", "suspended")
            await expect(rows).to_have_count(4, timeout=WAIT_MS)
            await page.fill("#runs-tenant", "acme")
            await page.press("#runs-tenant", "Enter")
            await expect(rows).to_have_count(3, timeout=WAIT_MS)
            await expect(page.locator(f'#runs tr[data-run="{theirs.id}"]')).to_have_count(0)
            await page.select_option("#runs-status", "")
            await page.fill("#runs-workflow", "three")
            await page.press("#runs-workflow", "Enter")
            await expect(rows).to_have_count(1, timeout=WAIT_MS)
            await page.locator(f'#runs tr[data-run="{done.id}"]').click()
            steps = page.locator("#wf-run-steps li")
            await expect(steps).to_have_count(3, timeout=WAIT_MS)
            await expect(steps.nth(1)).to_contain_text("command Stock.reserve")
            await expect(page.locator('#wf-run-facts dd[data-fact="result"]')).to_have_text(
                '"reserved, 2 left"'
            )
            await expect(page.locator("#wf-cancel")).to_be_disabled()

            # Signal one run: it completes; cancel another: it compensates and ends cancelled.
            await page.fill("#runs-workflow", "compensating")
            await page.press("#runs-workflow", "Enter")
            await expect(rows).to_have_count(2, timeout=WAIT_MS)
            await page.locator(f'#runs tr[data-run="{shipped.id}"]').click()
            await expect(page.locator("#wf-run-title")).to_contain_text(shipped.id)
            await expect(page.locator("#wf-run-steps li").nth(1)).to_have_class("pending")
            await page.fill("#wf-signal-name", "Shipped")
            await page.fill("#wf-signal-payload", '{"tracking": "T-1"}')
            await page.click("#wf-signal")
            await expect(page.locator("#status")).to_contain_text(
                f"signal Shipped sent to {shipped.id}", timeout=WAIT_MS
            )
            await t.drain()
            facts = page.locator("#wf-run-facts")
            await expect(facts.locator("dd[data-fact=status]")).to_have_text(
                "completed", timeout=WAIT_MS
            )
            assert (await t.runtime.workflows.status(shipped.id)).status == "completed"

            await page.locator(f'#runs tr[data-run="{stopped.id}"]').click()
            await expect(page.locator("#wf-run-title")).to_contain_text(stopped.id)
            await page.click("#wf-cancel")
            await expect(page.locator("#status")).to_contain_text(
                f"cancel requested for {stopped.id}", timeout=WAIT_MS
            )
            assert dialogs and stopped.id in dialogs[-1]
            await t.drain()
            await expect(facts.locator("dd[data-fact=status]")).to_have_text(
                "cancelled", timeout=WAIT_MS
            )
            assert await t.get(Order, "o-3", tenant="acme").marks() == ["reserve", "compensate"]

            # The screenshot: every run of the tenant, a waiting one opened on its timeline.
            await page.fill("#runs-workflow", "")
            await page.press("#runs-workflow", "Enter")
            await expect(rows).to_have_count(5, timeout=WAIT_MS)
            await page.locator(f'#runs tr[data-run="{waiting.id}"]').click()
            timeline = page.locator("#wf-run-steps li")
            await expect(timeline).to_have_count(4, timeout=WAIT_MS)
            await expect(timeline.nth(2)).to_contain_text("job charge")
            await expect(timeline.nth(3)).to_have_class("pending")
            await expect(page.locator("#wf-cancel")).to_be_enabled()
            await page.fill("#wf-signal-name", "Shipped")
            await page.fill("#wf-signal-payload", '{"tracking": "TRACK-7"}')
            path = shot(tmp_path, "console-workflows.png")
            await page.screenshot(path=str(path), full_page=True)
            assert path.stat().st_size > 10_000


async def test_a_refused_user_sees_no_run(served: Serve, browser: Browser) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        run = await s.t.get(Order, "o-1", tenant="acme").compensating.start()
        await s.t.drain()
        page = await browser.new_page()
        try:
            await page.goto(f"{s.url}/console/")
            await page.locator("#login").wait_for(state="visible", timeout=WAIT_MS)
            # The operator's name, but in tenant acme: not an operator.
            await page.fill("#login-value", f"Bearer {token(OPERATOR, 'acme')}")
            await page.click("#login-submit")
            await expect(page.locator("#login-error")).to_contain_text(
                "may not use the console", timeout=WAIT_MS
            )
            await page.click(".tab[data-tab=workflows]")
            await expect(page.locator("#login-error")).to_contain_text("may not use the console")
            assert await page.locator("#runs tbody tr").count() == 0
            assert run.id not in await page.content()
        finally:
            await page.close()
