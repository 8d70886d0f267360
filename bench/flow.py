#!/usr/bin/env python3
"""Flow-control claim rates (issue 17): the uncapped claim beside a concurrency cap and a rate.

    PYTHONPATH=src python bench/flow.py [--url URL] [--jobs 5000] [--rounds 3] [--json PATH]

One invocation, one server (default: a throwaway embedded PostgreSQL). Per variant and round, a
fresh schema gets ``--jobs`` no-op jobs without routes (so only the executor's claims, token
takes and settles are timed, no route turns), enqueued 50 per turn with the executor off; then
one runtime with ``executor_concurrency=64`` drains them and the rate is jobs settled per second.
The variants differ only in the job's options:

* ``uncapped``: ``@akter.job()``;
* ``concurrency``: ``@akter.job(concurrency=64)``: the cap equals the executor's slots, so the
  figure is the cost of counting the cap (a type lock, a live count per claim), not its limit;
* ``rate``: ``@akter.job(rate=akter.Rate(1_000_000, per=1))``: tokens never run out, so the
  figure is the cost of taking them (two statements per claim);
* ``capped8`` / ``rate500``: the limits doing their work (``concurrency=8``;
  ``Rate(500, per=1, burst=50)``), to show each holds its figure.

The variants rotate within each round; the table shows the median per variant and every round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import akter
from akter._store.embedded import EmbeddedPostgres


class Work(BaseModel):
    k: int


class Flow(akter.Actor[akter.EmptyState]):
    """Enqueues the jobs of every variant."""

    @akter.command
    async def stage(self, variant: str, first: int, n: int) -> None:
        job = VARIANTS[variant]
        for k in range(first, first + n):
            self.enqueue(job, Work(k=k))

    @akter.job()
    async def uncapped(call: akter.JobCall, work: Work) -> None:
        return None

    @akter.job(concurrency=64)
    async def concurrency(call: akter.JobCall, work: Work) -> None:
        return None

    @akter.job(rate=akter.Rate(1_000_000, per=1))
    async def rate(call: akter.JobCall, work: Work) -> None:
        return None

    @akter.job(concurrency=8)
    async def capped8(call: akter.JobCall, work: Work) -> None:
        return None

    @akter.job(rate=akter.Rate(500, per=1, burst=50))
    async def rate500(call: akter.JobCall, work: Work) -> None:
        return None


VARIANTS: dict[str, Any] = {
    "uncapped": Flow.uncapped,
    "concurrency": Flow.concurrency,
    "rate": Flow.rate,
    "capped8": Flow.capped8,
    "rate500": Flow.rate500,
}
PER_TURN = 50


async def drain(url: str, variant: str, jobs: int) -> float:
    """Enqueue ``jobs`` rows of ``variant`` with the executor off; the drain's jobs/s."""
    schema = f"flow_{variant}_{uuid.uuid4().hex[:8]}"
    job = VARIANTS[variant]
    options: dict[str, Any] = {
        "database_url": url,
        "schema": schema,
        "max_pending_commands": 50_000,
    }
    async with akter.Runtime([Flow], relay=False, jobs=[], **options) as staging:
        handles = [staging.get(Flow, f"f{i}") for i in range(jobs // PER_TURN)]
        await asyncio.gather(
            *(h.stage(variant, i * PER_TURN, PER_TURN) for i, h in enumerate(handles))
        )
    runtime = akter.Runtime([Flow], relay=False, jobs=[job], executor_concurrency=64, **options)
    async with runtime:
        t = time.perf_counter()
        await runtime._loop.start()
        runtime._loop.wake()
        while True:  # polled: the figure includes at most 5 ms of this wait
            if runtime._jobs.finished >= jobs:
                break
            await asyncio.sleep(0.005)
        seconds = time.perf_counter() - t
        await runtime._jobs.wait_idle()
    return jobs / seconds


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def run(args: argparse.Namespace, url: str) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {v: [] for v in args.variants}
    names = list(args.variants)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for variant in order:
            rate = await drain(url, variant, args.jobs)
            rates[variant].append(round(rate, 1))
            print(f"round {r + 1} {variant}: {rate:.0f} jobs/s (load {load()})", flush=True)
    return rates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    p.add_argument("--json", help="append one JSON line with the results")
    args = p.parse_args()
    server = None
    url = args.url
    if url is None:
        server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="akter-flow-")))
        url = server.start()
    try:
        print(f"load before: {load()}")
        rates = asyncio.run(run(args, url))
    finally:
        if server is not None:
            server.stop()
    print(f"load after: {load()}")
    base = statistics.median(rates["uncapped"]) if "uncapped" in rates else None
    print("\n| variant | median jobs/s | × uncapped | rounds |\n|---|---|---|---|")
    for variant, values in rates.items():
        median = statistics.median(values)
        ratio = f"{median / base:.2f}" if base else "-"
        print(f"| {variant} | {median:.0f} | {ratio} | {', '.join(f'{v:.0f}' for v in values)} |")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"jobs": args.jobs, "rates": rates}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
