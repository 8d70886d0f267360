"""A runner hosting the ``Beacon`` singleton in a child process, for the RN-01 kill drills.

Usage (from the repository root)::

    python -m tests.faults.runner_child URL SCHEMA [--lease-ms N] [--refresh-ms N]
        [--heartbeat-ms N] [--margin-ms N] [--beat-ms N] [--fenced]

It runs ``akter.Runtime([Beacon], maintenance=False, relay=False)`` on the given database and
schema, with the singleton tunables of ``runtime._runners`` set *before* the runtime starts (so
even its first acquisition uses them). ``--margin-ms`` scales the loop guard's stop margin
(``akter._engine.runners.STOP_MARGIN_MS``, 5 s and not a tunable): production runs a 35 s lease,
10 s refreshes and a 5 s margin; the drills default to a tenth of each.

Protocol on stdout: ``READY <runner_id>`` once started. End of input stops the runtime gracefully
(its lease is released), prints ``STOPPED`` and exits with status 0. The loop itself reports
nothing here: it writes its beats into ``<schema>.loop_beats`` (see ``runner_actors``).
``--fenced`` hosts ``FencedBeacon`` instead, whose beats are fenced commands.

``--tally`` hosts ``Tally`` instead (the frozen-turn drill, hardening finding 7) and reads
commands from its input:

- ``HOLD <id>``: calls ``Tally.hold`` on ``<id>`` with a fresh command id and ``retry=False``;
  inside the turn it prints ``HELD <command id>`` and waits for a ``GO`` line;
- ``RETRY <id> <command id>``: calls ``Tally.hold`` again with that command id;
- every call ends with ``DONE <command id> ok <applied ids, comma-separated>`` or
  ``DONE <command id> error <reason>``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import akter
from akter._engine import runners as runners_module
from tests.faults.runner_actors import BEAT, HOLD, Beacon, FencedBeacon, Tally

#: One tenth of production: lease 35 s, refresh 10 s, heartbeat 10 s, stop margin 5 s.
SCALED = {"lease_ms": 3_500, "refresh_ms": 1_000, "heartbeat_ms": 1_000, "margin_ms": 500}


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> int:
    """Host the singleton until end of input (or until killed)."""
    BEAT["s"] = args.beat_ms / 1000
    runners_module.STOP_MARGIN_MS = args.margin_ms
    actor = Tally if args.tally else FencedBeacon if args.fenced else Beacon
    runtime = akter.Runtime(
        [actor], database_url=args.url, schema=args.schema, maintenance=False, relay=False
    )
    runtime._runners.lease_ms = args.lease_ms
    runtime._runners.refresh_ms = args.refresh_ms
    runtime._runners.heartbeat_ms = args.heartbeat_ms
    go = asyncio.Event()
    calls: set[asyncio.Task[None]] = set()

    async def call(actor_id: str, command_id: str) -> None:
        try:
            applied = await runtime.call(
                Tally, actor_id, "hold", {}, command_id=command_id, retry=False
            )
        except akter.ActorError as exc:
            say(f"DONE {command_id} error {exc.reason}")
        else:
            say(f"DONE {command_id} ok {','.join(applied)}")

    async def gate(command_id: str) -> None:
        say(f"HELD {command_id}")
        await go.wait()

    async with runtime:
        say(f"READY {runtime._runners.runner_id}")
        while line := await asyncio.to_thread(sys.stdin.readline):
            words = line.split()
            if words[:1] == ["GO"]:
                go.set()
            elif words[:1] == ["HOLD"]:
                command_id = await runtime.mint_command_id()
                HOLD["gate"] = lambda cid=command_id: gate(cid)
                calls.add(asyncio.create_task(call(words[1], command_id)))
            elif words[:1] == ["RETRY"]:
                calls.add(asyncio.create_task(call(words[1], words[2])))
        await asyncio.gather(*calls)
    say("STOPPED")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.runner_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("--lease-ms", type=int, default=SCALED["lease_ms"])
    parser.add_argument("--refresh-ms", type=int, default=SCALED["refresh_ms"])
    parser.add_argument("--heartbeat-ms", type=int, default=SCALED["heartbeat_ms"])
    parser.add_argument("--margin-ms", type=int, default=SCALED["margin_ms"])
    parser.add_argument("--beat-ms", type=int, default=50)
    parser.add_argument("--fenced", action="store_true", help="host FencedBeacon")
    parser.add_argument("--tally", action="store_true", help="host Tally, read HOLD/GO/RETRY")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
