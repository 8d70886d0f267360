"""A job runner in a child process, for tests that SIGKILL it mid-attempt.

Usage (from the repository root)::

    python -m tests.faults.jobs_child URL SCHEMA [--pause POINT] [--route COMMAND] [--hold S]
        [--announce] [--lease S] [--cancel-check S] [--claim-lease S] [--poll S]
        [--concurrency N] [--pool N] [--settle-wait S]

It runs ``akter.Runtime(ACTORS)`` of :mod:`tests.faults.jobs_actors` with its relay (so it claims
job rows and delivers route intents) on the given database and schema; its executors log every
call in ``<schema>.job_calls`` and hold it ``--hold`` seconds (negative: until killed). Protocol
lines on stdout:

- ``READY <pid>`` once the runtime is up;
- ``STARTED <job_id> <attempt>`` when an executor call starts (with ``--announce``);
- ``PAUSED <point> <job_id or command id> <attempt or ->`` when the operation armed with
  ``--pause`` holds at the point (``before_commit`` only matches a batch running the route
  command ``--route``; ``before_settle_flush`` names the batch's job ids, comma-separated); it
  then holds until the process is killed.

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
from tests.faults.jobs_actors import ACTORS, RECORDER


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _matcher(args: argparse.Namespace) -> Any:
    if args.pause != "before_commit" or not args.route:
        return None

    def runs_route(info: dict[str, Any]) -> bool:
        return any(request.member.name == args.route for request in info["batch"])

    return runs_route


def _describe(info: dict[str, Any]) -> str:
    if "job_ids" in info:
        return f"{','.join(info['job_ids'])} -"
    if "job_id" in info:
        return f"{info['job_id']} {info['attempt']}"
    batch = info.get("batch") or []
    ids = [r.command_id.raw for r in batch if r.member.name == batch[0].member.name]
    return f"{ids[0] if ids else '-'} -"


async def run(args: argparse.Namespace) -> int:
    """Serve until end of input (or until killed)."""
    RECORDER.configure(
        args.url,
        args.schema,
        hold=args.hold,
        on_start=(lambda job_id, attempt: say(f"STARTED {job_id} {attempt}"))
        if args.announce
        else None,
    )
    hooks = Hooks()
    pause = hooks.pause_next(args.pause, _matcher(args)) if args.pause else None
    runtime = akter.Runtime(
        ACTORS,
        database_url=args.url,
        schema=args.schema,
        hooks=hooks,
        lease=args.lease,
        cancel_check=args.cancel_check,
        claim_lease=args.claim_lease,
        poll=args.poll,
        executor_concurrency=args.concurrency,
        pool_size=args.pool,
        maintenance=False,
        settle_wait=args.settle_wait,
    )
    try:
        async with runtime:

            async def report_pause() -> None:
                assert pause is not None
                await pause.reached.wait()
                say(f"PAUSED {pause.point} {_describe(pause.info)}")

            watcher = asyncio.create_task(report_pause()) if pause else None
            say(f"READY {os.getpid()}")
            runtime._relay.wake()  # a first pass at once, not after one poll
            while await asyncio.to_thread(sys.stdin.readline):
                pass
            if watcher is not None:
                watcher.cancel()
    finally:
        await RECORDER.close()
    say("STOPPED")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.jobs_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument(
        "--pause",
        choices=["before_execute", "after_execute", "before_commit", "before_settle_flush"],
        default=None,
    )
    parser.add_argument("--route", default=None, help="the route command before_commit waits for")
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--announce", action="store_true")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--cancel-check", type=float, default=1.0)
    parser.add_argument("--claim-lease", type=float, default=3.0)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--settle-wait", type=float, default=0.002)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
