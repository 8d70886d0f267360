#!/usr/bin/env python3
"""Chaos drill (issue 5): runner SIGKILLs and a PostgreSQL restart under load; prints its table.

    python bench/chaos.py [--duration 66] [--kill-every 15] [--pg-restart-at 37.5 | --no-pg]
                          [--callers 16] [--actors 256] [--runners 3] [--json FILE]

A throwaway embedded PostgreSQL in a temp directory; ``--runners`` runner processes
(``tests.faults.chaos_child``: turns, relay with ``notify=True``, executors, HTTP on a unix
socket; intent claim lease 5 s, job lease 3 s); ``--callers`` callers in this process call
``Account.work`` on ``--actors`` accounts through ``akter.client.Client``, retrying any error with
the same command id on the next runner. Each command appends its id to the account's state,
sends an intent to an ``Inbox`` (which appends the intent id) and enqueues a job (its executor
records every attempt in a side table; ``on_success`` appends the job id). Every
``--kill-every`` seconds one runner is SIGKILLed and restarted; once, at ``--pg-restart-at``,
the server is stopped (``pg_ctl stop -m fast``) and started again. After ``--duration`` the
callers finish, the outbox drains, and the database is checked: acknowledged commands lost,
transitions applied twice, intents delivered twice, jobs terminal other than exactly once,
outbox rows left — all must be 0. Recovery per kill: the database clock just before SIGKILL →
the first turn committed by a survivor; → the acknowledgement of the calls in flight on the
victim; → every outbox row leased at the kill settled or claimed again. The exit status is 1
when a check failed. See ``tests/faults/chaos_drill.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

SELF = Path(__file__).resolve()
# Not bench/ itself: a script there named like a stdlib module (bench/http.py) would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SELF.parent]
sys.path.insert(0, str(SELF.parent.parent))

from tests.faults.chaos_drill import FULL, Drill, Plan  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=FULL.duration_s)
    parser.add_argument("--kill-every", type=float, default=FULL.kill_every_s)
    parser.add_argument("--pg-restart-at", type=float, default=FULL.pg_restart_at_s)
    parser.add_argument("--no-pg", action="store_true", help="no PostgreSQL restart")
    parser.add_argument("--pg-down", type=float, default=FULL.pg_down_s)
    parser.add_argument(
        "--no-notify", action="store_true", help="runners without notify=True (polling only)"
    )
    parser.add_argument("--callers", type=int, default=FULL.callers)
    parser.add_argument("--actors", type=int, default=FULL.actors)
    parser.add_argument("--runners", type=int, default=FULL.runners)
    parser.add_argument("--json", type=Path, help="append one JSON line with the results here")
    parser.add_argument("--logs", type=Path, help="write each runner's stderr into this directory")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    """Run the drill and print its table."""
    plan = Plan(
        duration_s=args.duration,
        callers=args.callers,
        actors=args.actors,
        runners=args.runners,
        kill_every_s=args.kill_every,
        pg_restart_at_s=None if args.no_pg else args.pg_restart_at,
        pg_down_s=args.pg_down,
        notify=not args.no_notify,
    )
    load_before = os.getloadavg()
    drill = Drill(plan, log=lambda line: print(f"# {line}", flush=True), log_dir=args.logs)
    started = time.monotonic()
    try:
        report = await drill.run()
    except BaseException:
        print(drill.child_stderr(), file=sys.stderr)
        raise
    load_after = os.getloadavg()
    print(
        f"\n### Chaos drill: {plan.runners} runners, {plan.callers} callers over {plan.actors} "
        f"actors, {plan.duration_s:.0f} s, SIGKILL every {plan.kill_every_s:.0f} s"
        + ("" if plan.pg_restart_at_s is None else ", one PostgreSQL restart")
        + ("" if plan.notify else ", notify=False")
        + f" (load average {load_before[0]:.1f} → {load_after[0]:.1f}; "
        f"{time.monotonic() - started:.0f} s in all)\n"
    )
    print(report.table())
    problems = report.problems()
    recovery = report.recovery_problems()
    print("\nguarantees: " + ("PASS" if not problems else "FAIL"))
    for problem in problems:
        print(f"  - {problem}")
    print("runners recovered by themselves: " + ("yes" if not recovery else "NO"))
    for problem in recovery:
        print(f"  - {problem}")
    if args.json:
        record = {
            "drill": "chaos",
            "plan": dataclasses.asdict(plan),
            "elapsed_s": round(report.elapsed_s, 1),
            "counts": dataclasses.asdict(report.counts),
            "kills": [
                {
                    "slot": k.slot,
                    "at_s": round(k.kill_wall, 1),
                    "leased_rows": k.leased,
                    "survivor_commit_ms": k.survivor_commit_ms,
                    "in_flight_acked_ms": sorted(k.stalls_ms),
                    "in_flight_answered_before_kill": k.answered_before,
                    "leased_rows_settled_ms": k.leases_settled_ms,
                    "restart_s": round(k.restart_s, 1),
                }
                for k in report.kills
            ],
            "pg_restart": None
            if report.restart is None
            else {
                "outage_ms": report.restart.up_ms - report.restart.down_ms,
                "first_commit_ms": report.restart.first_commit_ms,
                "slot_commit_ms": list(report.restart.slot_commit_ms.values()),
                "readiness": dict(Counter(report.restart.readiness.values())),
                "replaced_by_the_drill": len(report.restart.replaced),
            },
            "errors": dict(report.errors),
            "runner_log": dict(report.child_log),
            "problems": problems,
            "recovery_problems": recovery,
            "loadavg": [load_before[0], load_after[0]],
        }
        with args.json.open("a") as out:
            out.write(json.dumps(record) + "\n")
    return 1 if problems or recovery else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
