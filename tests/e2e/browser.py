"""Headless Chromium for the browser tests (the console, the docs page): fixtures and waits.

Chromium is Debian's ``/usr/bin/chromium`` (or ``$AKTER_CHROMIUM``), driven with playwright; CI
installs it (``.ci/run``). Without it the browser tests skip and say so.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = os.environ.get("AKTER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: The longest a browser test waits for the page to show something.
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
