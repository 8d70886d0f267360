"""A runner of the chaos drill in a child process: turns, relay, executors and HTTP.

Usage (from the repository root)::

    python -m tests.faults.chaos_child URL SCHEMA SOCKET [--claim-lease S] [--lease S]
        [--poll S] [--no-notify]

It runs ``akter.Runtime([Account, Inbox], notify=True)`` (``--no-notify``: polling only) on the
given database and schema with a short intent claim lease and job lease (so the survivors take
over a dead runner's claims quickly), and serves ``akter.http.app`` with uvicorn on the unix
socket ``SOCKET``.

Protocol on stdout: ``READY <runner_id> <pid>`` once the runtime and the HTTP server are up.
End of input stops the HTTP server, drains the runtime, prints ``STOPPED <drain status>`` and
exits with status 0. The parent normally SIGKILLs it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

import uvicorn
from psycopg_pool import AsyncConnectionPool

import akter
from akter.http import app as http_app
from tests.faults.chaos_actors import RUNNER, SIDE, Account, Inbox


def dump_tasks() -> None:
    """Print every asyncio task's stack to stderr (on SIGUSR1: diagnosing a hang)."""
    for task in asyncio.all_tasks():
        sys.stderr.write(f"--- {task.get_name()}\n")
        task.print_stack(limit=8, file=sys.stderr)
    sys.stderr.flush()


_PLAIN = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class WithExtras(logging.Formatter):
    """The usual line plus the record's structured fields (akter logs reasons as extras)."""

    def format(self, record: logging.LogRecord) -> str:
        """Format one record."""
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _PLAIN}
        return f"{line} {extras}" if extras else line


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> int:
    """Serve until end of input (or until killed)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(WithExtras("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    side = AsyncConnectionPool(
        args.url, min_size=1, max_size=8, open=False, kwargs={"autocommit": True}
    )
    await side.open(wait=True, timeout=30.0)
    SIDE["pool"], SIDE["schema"] = side, args.schema
    runtime = akter.Runtime(
        [Account, Inbox],
        database_url=args.url,
        schema=args.schema,
        notify=args.notify,
        poll=args.poll,
        claim_lease=args.claim_lease,
        lease=args.lease,
        drain_deadline=5.0,
    )
    RUNNER["id"] = runtime._runners.runner_id
    server = uvicorn.Server(
        uvicorn.Config(
            http_app(runtime),
            uds=args.socket,
            log_level="critical",
            lifespan="off",
            access_log=False,
        )
    )
    try:
        async with runtime:
            serving = asyncio.create_task(server.serve(), name="chaos.http")
            while not server.started:
                if serving.done():
                    await serving  # raises what stopped it
                    raise RuntimeError("the HTTP server ended before it started")
                await asyncio.sleep(0.01)  # polling uvicorn's started flag
            say(f"READY {runtime._runners.runner_id} {os.getpid()}")
            while await asyncio.to_thread(sys.stdin.readline):
                pass
            server.should_exit = True
            await serving
        report = runtime.last_drain
        say(f"STOPPED {report.status if report else '?'}")
    finally:
        await side.close()
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.chaos_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("socket")
    parser.add_argument("--claim-lease", type=float, default=5.0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--no-notify", dest="notify", action="store_false")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
