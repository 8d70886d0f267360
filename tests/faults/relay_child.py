"""A relay runner in a child process, for tests that SIGKILL it or race it against the parent.

Usage (from the repository root)::

    python -m tests.faults.relay_child URL SCHEMA [--pause POINT] [--claim-lease S] [--poll S]
        [--notify] [--flaky N]

It runs ``akter.Runtime([Receiver])`` with its relay on the given database and schema and speaks
a line protocol on stdout:

- ``READY`` once the runtime (and, with ``--notify``, its LISTEN connection) is up;
- ``PAUSED <point> <intent_id>`` when the delivery armed with ``--pause`` holds at the point
  (``after_claim`` or ``before_outbox_delete``); it then holds until the process is killed;
- ``RETRIED <intent_id> <attempts>`` after each failed delivery's backoff write.

It reads commands on stdin: ``ADVANCE <ms>`` moves the runtime's framework clock and wakes the
relay (answer ``ADVANCED <offset>``); ``STATS`` answers ``STATS {"delivered": n, "retried": m}``.
End of input stops the runtime gracefully, prints ``STOPPED {"delivered": n, "retried": m}`` and
exits with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

import akter
from akter._engine.hooks import Hooks
from tests.faults.relay_actors import FLAKY, Receiver

RETRY_MESSAGE = "Outbox delivery failed; retrying with backoff"


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class RetryLines(logging.Handler):
    """Turns the relay's backoff warning into a ``RETRIED`` line."""

    def emit(self, record: logging.LogRecord) -> None:
        """Report one failed delivery."""
        if record.getMessage().partition(": ")[0] == RETRY_MESSAGE:
            say(f"RETRIED {getattr(record, 'intent_id', '?')} {getattr(record, 'attempts', '?')}")


async def run(args: argparse.Namespace) -> int:
    """Serve the relay until end of input (or until killed)."""
    FLAKY["n"] = args.flaky
    logging.getLogger("akter.relay").addHandler(RetryLines())
    hooks = Hooks()
    pause = hooks.pause_next(args.pause) if args.pause else None
    runtime = akter.Runtime(
        [Receiver],
        database_url=args.url,
        schema=args.schema,
        hooks=hooks,
        notify=args.notify,
        poll=args.poll,
        claim_lease=args.claim_lease,  # None: the default lease
    )
    async with runtime:

        async def report_pause() -> None:
            assert pause is not None
            await pause.reached.wait()
            say(f"PAUSED {pause.point} {pause.info['intent_id']}")

        watcher = asyncio.create_task(report_pause()) if pause else None
        say("READY")
        runtime._relay.wake()  # a first pass at once, not after one poll
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            match line.split():
                case ["ADVANCE", by]:
                    runtime._clock.offset_ms += int(by)
                    runtime._relay.wake()
                    say(f"ADVANCED {runtime._clock.offset_ms}")
                case ["STATS"]:
                    stats = {
                        "delivered": runtime._relay.delivered,
                        "retried": runtime._relay.retried,
                    }
                    say(f"STATS {json.dumps(stats)}")
                case _:
                    say(f"UNKNOWN {line.strip()}")
        if watcher is not None:
            watcher.cancel()
    stats = {"delivered": runtime._relay.delivered, "retried": runtime._relay.retried}
    say(f"STOPPED {json.dumps(stats)}")
    return 0


def main(argv: list[str]) -> int:
    """Parse the arguments and run."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.relay_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("--pause", choices=["after_claim", "before_outbox_delete"])
    parser.add_argument("--claim-lease", type=float)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--notify", action="store_true")
    parser.add_argument("--flaky", type=int, default=0)
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
