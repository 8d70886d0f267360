"""Schemathesis hooks for ``test_http_schemathesis``: mint a real command id, nothing else.

A generated ``Idempotency-Key`` that matches the documented pattern is a well-formed id that the
server cannot know (its span and clock are random), so it is replaced with a fresh id from ``POST
/command-ids``, minted with the run's credentials. Keys that break the pattern (negative cases)
and missing keys are sent as generated. The server's URL and credential header come from
``AKTER_ST_URL`` and ``AKTER_ST_HEADER`` (``Name: value``).
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx
import schemathesis

from akter.http._openapi_parts import COMMAND_ID_PATTERN

_WELL_FORMED = re.compile(COMMAND_ID_PATTERN)


def _mint() -> str:
    name, _, value = os.environ["AKTER_ST_HEADER"].partition(":")
    response = httpx.post(
        f"{os.environ['AKTER_ST_URL']}/command-ids", headers={name: value.strip()}, timeout=10
    )
    response.raise_for_status()
    return str(response.json()["command_id"])


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    """Replace a well-formed generated command id with a minted one."""
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and _WELL_FORMED.fullmatch(key):
        case.headers["Idempotency-Key"] = _mint()
