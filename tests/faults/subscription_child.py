"""A runner hosting the subscriptions' actors in a child process, for the kill drill.

Usage (from the repository root)::

    python -m tests.faults.subscription_child URL SCHEMA

It runs ``akter.Runtime`` over :data:`tests.integration.subscription_actors.ACTORS` with its pass
loop (so its subscriptions lane) on the given database and schema, a short claim lease and poll,
prints ``READY <pid>`` and serves until its input ends (or it is SIGKILLed).
"""

from __future__ import annotations

import asyncio
import os
import sys

import akter
from tests.integration.subscription_actors import ACTORS


async def run(url: str, schema: str) -> int:
    """Serve until end of input."""
    runtime = akter.Runtime(ACTORS, database_url=url, schema=schema, poll=0.1, claim_lease=3)
    async with runtime:
        sys.stdout.write(f"READY {os.getpid()}\n")
        sys.stdout.flush()
        while await asyncio.to_thread(sys.stdin.readline):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1], sys.argv[2])))
