"""A workflow runner in a child process, for tests that SIGKILL it mid-run.

Usage (from the repository root)::

    python -m tests.faults.workflow_child URL SCHEMA [--pause POINT --seq N [--nth K]]
        [--workflow-lease S] [--lease S] [--claim-lease S] [--poll S] [--no-jobs]

It runs ``akter.Runtime(ACTORS)`` of :mod:`tests.faults.workflow_actors` with its relay (so it
claims workflow runs, delivers intents and executes jobs) on the given database and schema; its
handlers, local steps and executors log every execution in ``<schema>.wf_effects``.

With ``--pause``, the ``K``-th (default first) operation reaching the workflow fault point
``POINT`` (``before_step_record`` or ``after_step_record``) with the journal records of seq
``N`` alone holds there until the process is killed; ``before_workflow_complete`` holds the
first run's end. ``--no-jobs`` executes no jobs (a job step's job stays staged). Protocol lines
on stdout:

- ``READY <pid> <runner_id>`` once the runtime is up;
- ``PAUSED <point> <run_id> <seqs, comma-separated, or the ending status>`` when it holds.

End of input stops the runtime gracefully, prints ``STOPPED`` and exits with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import akter
from akter._engine.hooks import Hooks
from tests.faults.workflow_actors import ACTORS, EFFECTS


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def nth_record_of(seq: int, nth: int) -> Any:
    """A fault-point matcher: the ``nth`` write whose newest record is ``seq``'s.

    A write holds the step's own record last; before it, the 'done' records buffered since the
    previous write (a command step's outcome is written with the next record).
    """
    seen = 0

    def matches(info: dict[str, Any]) -> bool:
        nonlocal seen
        if "seqs" not in info:
            return True  # before_workflow_complete: the first run's end
        if not info["seqs"] or list(info["seqs"])[-1] != seq:
            return False
        seen += 1
        return seen == nth

    return matches


async def run(args: argparse.Namespace) -> int:
    """Serve until end of input (or until killed)."""
    EFFECTS.configure(args.url, args.schema)
    hooks = Hooks()
    pause = hooks.pause_next(args.pause, nth_record_of(args.seq, args.nth)) if args.pause else None
    runtime = akter.Runtime(
        ACTORS,
        database_url=args.url,
        schema=args.schema,
        hooks=hooks,
        workflow_lease=args.workflow_lease,
        lease=args.lease,
        claim_lease=args.claim_lease,
        poll=args.poll,
        maintenance=False,
        jobs=[] if args.no_jobs else None,
    )
    try:
        async with runtime:

            async def report_pause() -> None:
                assert pause is not None
                info = await pause.wait(within=3600)
                seqs = ",".join(str(s) for s in info.get("seqs", [])) or info["status"]
                say(f"PAUSED {pause.point} {info['run_id']} {seqs}")

            watcher = asyncio.create_task(report_pause()) if pause else None
            say(f"READY {os.getpid()} {runtime._runners.runner_id}")
            runtime._relay.wake()  # a first pass at once, not after one poll
            while await asyncio.to_thread(sys.stdin.readline):
                pass
            if watcher is not None:
                watcher.cancel()
    finally:
        await EFFECTS.close()
    say("STOPPED")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.workflow_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument(
        "--pause",
        choices=["before_step_record", "after_step_record", "before_workflow_complete"],
        default=None,
    )
    parser.add_argument("--no-jobs", action="store_true")
    parser.add_argument("--seq", type=int, default=0)
    parser.add_argument("--nth", type=int, default=1)
    parser.add_argument("--workflow-lease", type=float, default=2.0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--claim-lease", type=float, default=3.0)
    parser.add_argument("--poll", type=float, default=0.1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
