"""A job runner in a child process for the job stream kill drill.

Usage (from the repository root)::

    python -m tests.faults.stream_child URL SCHEMA [--lease S]

It runs ``akter.Runtime`` of :mod:`tests.faults.stream_actors` (relay and executor) on the given
database and schema and prints ``READY <pid>``; end of input stops it and it prints ``STOPPED``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import akter
from tests.faults.stream_actors import ACTORS


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> int:
    """Serve until end of input (or until killed)."""
    runtime = akter.Runtime(
        ACTORS,
        database_url=args.url,
        schema=args.schema,
        lease=args.lease,
        cancel_check=1,
        claim_lease=3,
        poll=0.1,
        maintenance=False,
    )
    async with runtime:
        say(f"READY {os.getpid()}")
        while await asyncio.to_thread(sys.stdin.readline):
            pass
    say("STOPPED")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.stream_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("--lease", type=float, default=3.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
