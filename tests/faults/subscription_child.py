"""A runner of the subscriptions kill drill in a child process: sources and subscribers.

Usage (from the repository root)::

    python -m tests.faults.subscription_child URL SCHEMA [SEED]

It runs ``akter.Runtime`` over :data:`tests.faults.subscription_drill_actors.ACTORS` with its
pass loop (so its subscriptions lane) on the given database and schema, a short claim lease and
poll, and prints ``READY <pid>``. Given a ``SEED``, it is also a source runner: :data:`LOOPS`
loops make orders pay (routed to warehouses; one in twenty of those turns raises after emitting,
so it rolls back: it writes :data:`ROLLED_BACK` on stderr) and users post, in this process,
until a SIGKILL or the end of its input:
then it ends its loops and stops (the stop drains the turns under way).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys

import akter
from tests.faults.subscription_drill_actors import ACTORS
from tests.integration.subscription_actors import Order, User

WAREHOUSES, ORDERS, USERS = 4, 12, 4
#: Concurrent source loops of a source runner.
LOOPS = 4
#: The line a source runner writes on stderr for each source turn that rolled back.
ROLLED_BACK = "ROLLED BACK"


async def produce(runtime: akter.Runtime, rng: random.Random) -> None:
    """One source loop: random source turns, forever (module docstring)."""
    while True:
        if rng.random() < 0.5:
            order = runtime.get(Order, f"o{rng.randrange(ORDERS)}")
            warehouse = f"w{rng.randrange(WAREHOUSES)}"
            if rng.random() < 0.05:
                try:
                    await order.pay_then_break(warehouse)  # its event never commits
                except akter.ActorError as exc:
                    if exc.reason == "Defect":  # the drill counts the turns rolled back
                        sys.stderr.write(f"{ROLLED_BACK}\n")
                continue
            call = order.pay(warehouse, rng.randint(1, 3))
        else:
            call = runtime.get(User, f"u{rng.randrange(USERS)}").post(rng.randint(1, 2))
        with contextlib.suppress(akter.ActorError):
            await call


async def run(url: str, schema: str, seed: int | None) -> int:
    """Serve (and produce, given a seed) until end of input."""
    runtime = akter.Runtime(ACTORS, database_url=url, schema=schema, poll=0.1, claim_lease=3)
    async with runtime:
        loops: list[asyncio.Task[None]] = []
        if seed is not None:
            rng = random.Random(seed)
            loops = [
                asyncio.create_task(produce(runtime, random.Random(rng.random())))
                for _ in range(LOOPS)
            ]
        sys.stdout.write(f"READY {os.getpid()}\n")
        sys.stdout.flush()
        while await asyncio.to_thread(sys.stdin.readline):
            pass
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    return 0  # the runtime's stop drained the turns under way: every source turn has ended


if __name__ == "__main__":
    seed_arg = int(sys.argv[3]) if len(sys.argv) > 3 else None
    sys.exit(asyncio.run(run(sys.argv[1], sys.argv[2], seed_arg)))
