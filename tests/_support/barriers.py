"""Barriers on what the runtime observably did, instead of ``asyncio.sleep(0)``."""

from __future__ import annotations

import akter
from tests._support.polling import until


async def until_pending(runtime: akter.Runtime, count: int, *, within: float = 10.0) -> None:
    """Return once exactly ``count`` commands wait or run in ``runtime``'s mailboxes.

    A test that queues calls behind a paused turn waits here until they are all in the
    mailbox, rather than hoping one loop step was enough.
    """
    await until(
        lambda: runtime._dispatcher.pending,
        within=within,
        what=f"{count} commands in the mailboxes",
        holds=lambda pending: pending == count,
        interval=0,
    )
