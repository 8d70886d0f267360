"""The ``/docs`` page in a real headless Chromium, behind ``ApiKeys`` and behind ``BearerJWT``.

The page shows a credential field for the document's scheme (an API key, a bearer token). With
a wrong credential, a command's Send shows the refused mint (401) and sends no command; with the
right one it mints the command id with it, sends the command as that user and shows 200; the
durable row records the credential's user. Chromium is Debian's ``/usr/bin/chromium`` (or
``$AKTER_CHROMIUM``); the test is skipped only when no such binary exists.
"""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

import akter.http
from tests.e2e.browser import WAIT_MS
from tests.e2e.conftest import SECRET, Account, Serve, Vault, count, token

pytestmark = pytest.mark.timeout(90)

KEY = "docs-key-0123456789"


@pytest.mark.parametrize("scheme", ["ApiKeys", "BearerJWT"])
async def test_the_docs_page_takes_credentials_and_calls_a_command(
    served: Serve, browser: Browser, scheme: str
) -> None:
    if scheme == "ApiKeys":
        auth: akter.http.AuthProvider = akter.http.ApiKeys({KEY: ("alice", "acme")})
        credential = KEY
    else:
        auth, credential = akter.http.BearerJWT(SECRET), token("alice", "acme")
    async with served([Account, Vault], auth=auth) as s:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            await page.goto(f"{s.url}/docs")
            key = page.locator(f"#cred-{scheme}")
            await expect(key).to_be_visible(timeout=WAIT_MS)
            op = page.locator("#ops > details").filter(has_text="POST /actors/Account/{id}/deposit")
            await op.locator("summary").first.click()
            await op.locator("input.param[name=id]").fill("docs-1")
            await op.locator("textarea.body").fill('{"cents": 7}')
            out = op.locator("pre.out")

            # A wrong key: the mint is refused and shown; no command goes out.
            await key.fill("not-the-key")
            await op.get_by_role("button", name="Send").click()
            await expect(out).to_contain_text("401", timeout=WAIT_MS)
            await expect(out).to_contain_text("invalid_credentials")
            assert await count(s.t, "receipts") == 0

            # The right key: minted with it, sent with it, 200.
            await key.fill(credential)
            await op.get_by_role("button", name="Send").click()
            await expect(out).to_have_text("200\n7", timeout=WAIT_MS)
            purse = await s.t.get(Account, "docs-1", tenant="acme").purse()
            assert (purse.balance, purse.callers) == (7, ["alice"])
            assert errors == []
        finally:
            await page.close()
