"""The app's WebSocket from a page in headless Chromium (docs/guides/live.md).

A page served beside the app (same origin) opens ``/ws``, subscribes to a query watch and a
broadcast topic, sends a command with an idempotency key, and shows the command's result, the
broadcast and the watch's new value; the test checks them on the page and the durable row. A page
of another origin is refused before the upgrade.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.async_api import Browser, expect
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

import akter
import akter.http
from akter.testing import ActorTest
from tests.e2e.browser import WAIT_MS
from tests.integration.live_serving import serving

pytestmark = pytest.mark.timeout(90)


class Tally(BaseModel):
    n: int = 0


class Counter(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        self.broadcast("news", {"added": k})
        return self.state.n

    @akter.query(watch=True)
    async def total(self) -> int:
        return self.state.n


PAGE = """<!doctype html>
<html><body>
<p>value: <span id="value"></span></p>
<p>result: <span id="result"></span></p>
<p>broadcast: <span id="broadcast"></span></p>
<p>state: <span id="state">connecting</span></p>
<script>
const ws = new WebSocket(`ws://${location.host}/ws`);
const show = (id, text) => { document.getElementById(id).textContent = text; };
ws.onopen = () => {
  show("state", "open");
  ws.send(JSON.stringify({type: "subscribe", id: "w", kind: "watch", actor: "Counter",
                          actor_id: "c", query: "total"}));
  ws.send(JSON.stringify({type: "subscribe", id: "b", kind: "broadcast", actor: "Counter",
                          actor_id: "c", topic: "news"}));
};
ws.onclose = () => show("state", "closed");
ws.onmessage = (m) => {
  const msg = JSON.parse(m.data);
  if (msg.type === "value") show("value", String(msg.value));
  if (msg.type === "result") show("result", String(msg.value));
  if (msg.type === "broadcast") show("broadcast", JSON.stringify(msg.message));
  if (msg.type === "subscribed" && msg.id === "b") show("state", "following");
};
window.add = (k, key) => ws.send(JSON.stringify({type: "command", id: "c1", actor: "Counter",
  actor_id: "c", command: "add", args: {k: k}, idempotency_key: key}));
</script>
</body></html>
"""


async def page(request: Request) -> HTMLResponse:
    return HTMLResponse(PAGE)


async def test_a_page_sends_a_command_and_sees_the_broadcast_and_the_watch(
    akter_test: Callable[..., ActorTest], browser: Browser
) -> None:
    async with akter_test([Counter], watch_min_interval=0.01) as t:
        site = Starlette(routes=[Route("/page", page), Mount("/", akter.http.app(t.runtime))])
        async with serving(site) as address:
            tab = await browser.new_page()
            try:
                await tab.goto(f"http://{address}/page")
                await expect(tab.locator("#value")).to_have_text("0", timeout=WAIT_MS)
                await expect(tab.locator("#state")).to_have_text("following", timeout=WAIT_MS)
                key = await t.runtime.mint_command_id()
                await tab.evaluate("([k, key]) => window.add(k, key)", [5, key])
                await expect(tab.locator("#result")).to_have_text("5", timeout=WAIT_MS)
                await expect(tab.locator("#broadcast")).to_have_text('{"added":5}', timeout=WAIT_MS)
                await expect(tab.locator("#value")).to_have_text("5", timeout=WAIT_MS)
                # The same key again from the page: the same answer, one effect.
                await tab.evaluate("([k, key]) => window.add(k, key)", [5, key])
                await expect(tab.locator("#result")).to_have_text("5", timeout=WAIT_MS)
                assert (await t.inspect(t.get(Counter, "c"))).state == {"n": 5}
            finally:
                await tab.close()


async def test_a_page_of_another_origin_is_refused(
    akter_test: Callable[..., ActorTest], browser: Browser
) -> None:
    async with akter_test([Counter]) as t:
        app = akter.http.app(t.runtime)
        async with serving(Starlette(routes=[Mount("/", app)])) as api:
            pages = Starlette(routes=[Route("/page", page)])
            async with serving(pages) as other:
                tab = await browser.new_page()
                try:
                    # The page's own host is "other": its socket to "api" carries that origin.
                    html = PAGE.replace("${location.host}", api)
                    await tab.route(
                        f"http://{other}/page",
                        lambda route: route.fulfill(body=html, content_type="text/html"),
                    )
                    await tab.goto(f"http://{other}/page")
                    await expect(tab.locator("#state")).to_have_text("closed", timeout=WAIT_MS)
                    assert t.runtime.live.watching == 0
                finally:
                    await tab.close()
