"""A runner that owns an embedded PostgreSQL and keeps it busy, for RN-04 (SIGKILL of the owner).

Usage (from the repository root)::

    python -m tests.faults.runner_embedded DATA_DIR [--workers 8] [--ledgers 16]

It runs ``akter.Runtime([Ledger, Inbox], data_dir=DATA_DIR)``: the runtime starts (or adopts)
the embedded server of ``DATA_DIR`` and owns it. Then ``--workers`` tasks call ``Ledger.add`` back
to back, each with a command id minted here, over ``--ledgers`` ledgers. Every applied add
stages two intents to the ``Inbox`` of its id (one due at once, one 3 s later); the relay
delivers them meanwhile.

Protocol on stdout, one line each, flushed at once:

- ``READY <postmaster pid>`` once the runtime is up;
- ``SENT <command id> <ledger id> <k>`` before a call;
- ``OK <command id> <total>`` after its reply (the commit was acknowledged to the caller).

It never stops on its own: the parent SIGKILLs it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import akter
from tests.faults.runner_actors import Inbox, Ledger


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def postmaster_pid(data_dir: Path) -> int:
    """The server's pid, from ``pgdata/postmaster.pid``."""
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])


async def run(args: argparse.Namespace) -> int:
    """Load the runtime until killed."""
    async with akter.Runtime([Ledger, Inbox], data_dir=args.data_dir, poll=0.2) as runtime:
        say(f"READY {postmaster_pid(args.data_dir)}")

        async def worker(w: int) -> None:
            i = 0
            while True:
                cid = await runtime.mint_command_id()
                ledger = f"l{(w + i * args.workers) % args.ledgers}"
                k = 1 + (w + i) % 9
                say(f"SENT {cid} {ledger} {k}")
                total = await runtime.get(Ledger, ledger).with_command_id(cid).add(k)
                say(f"OK {cid} {total}")
                i += 1

        await asyncio.gather(*(worker(w) for w in range(args.workers)))
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.runner_embedded")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--ledgers", type=int, default=16)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
