"""A runner in a child process, for tests that SIGKILL it or run two processes side by side.

Usage (from the repository root)::

    python -m tests.faults.child pause URL SCHEMA POINT ACTOR_ID COMMAND_ID K
    python -m tests.faults.child serve-commands URL SCHEMA ACTOR_ID
    python -m tests.faults.child shared-write URL SCHEMA HOLD_ID ACTOR_ID ...

``pause`` arms ``pause_next(POINT)`` on the runtime's hooks, calls ``Counter.add(K)`` on
``ACTOR_ID`` with ``COMMAND_ID``, prints ``PAUSED POINT`` once the turn holds at the point, and
then waits to be killed. Should the call end without pausing, it prints ``UNPAUSED <outcome>``
and exits with status 3.

``serve-commands`` prints ``READY``, then reads one JSON request per line on stdin,
``{"calls": [{"cid": ..., "k": ...}, ...]}``, runs the calls concurrently and answers with one
line ``{"results": [{"cid": ..., "ok": total} | {"cid": ..., "error": "..."}, ...]}`` in request
order. End of input stops the runtime and exits with status 0.

``shared-write`` runs every warm turn through the shared writer, with one write at a time
(``akter._engine.turn.shared``). It warms ``HOLD_ID`` and each ``ACTOR_ID`` (one turn each)
and prints ``WARM {command id: [actor, total]}``; after a line on stdin it holds a turn of
``HOLD_ID`` at ``before_shared_write``, queues ``Counter.add(10)`` on each ``ACTOR_ID`` in the
order given (ids minted for the calls: only those turns are warm), releases the held turn and
prints ``SENT {command id: total}`` of the held turn once it committed. The queued turns are
the next write, sent then. It waits to be killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import akter
from akter._engine.turn.engine import TurnEngine
from tests._support.shared_line import Line
from tests.faults.actors import Counter

# Sink is deliberately not hosted: its intents must stay in the outbox (see tests.faults.actors).
ACTORS = [Counter]


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def pause(url: str, schema: str, point: str, actor_id: str, cid: str, k: int) -> int:
    """Hold a turn at ``point`` and wait to be killed."""
    async with akter.Runtime(ACTORS, database_url=url, schema=schema) as runtime:
        paused = runtime.hooks.pause_next(point)
        call = asyncio.create_task(runtime.get(Counter, actor_id).with_command_id(cid).add(k))
        reached = asyncio.create_task(paused.reached.wait())
        await asyncio.wait({call, reached}, return_when=asyncio.FIRST_COMPLETED)
        if not reached.done():
            reached.cancel()
            try:
                outcome = f"ok {call.result()}"
            except Exception as exc:
                outcome = f"error {exc!r}"
            say(f"UNPAUSED {outcome}")
            return 3
        say(f"PAUSED {point}")
        await asyncio.Event().wait()  # until SIGKILL
    return 0


async def serve_commands(url: str, schema: str, actor_id: str) -> int:
    """Answer add requests read from stdin until end of input."""
    async with akter.Runtime(ACTORS, database_url=url, schema=schema) as runtime:
        handle = runtime.get(Counter, actor_id)

        async def one(call: dict[str, Any]) -> dict[str, Any]:
            cid = str(call["cid"])
            try:
                return {"cid": cid, "ok": await handle.with_command_id(cid).add(int(call["k"]))}
            except akter.AkterError as exc:
                return {"cid": cid, "error": f"{type(exc).__name__}: {exc}"}

        say("READY")
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                return 0
            request = json.loads(line)
            results = await asyncio.gather(*(one(c) for c in request["calls"]))
            say(json.dumps({"results": results}))


async def shared_write(url: str, schema: str, hold: str, ids: list[str]) -> int:
    """Send a turn of each of ``ids`` in one shared write, then wait to be killed."""
    TurnEngine.hold_connections = False  # every warm turn goes through the writer
    async with akter.Runtime(ACTORS, database_url=url, schema=schema) as runtime:
        runtime._engine.shared.connections = 1
        line = Line.of(runtime._engine)
        warmed: dict[str, tuple[str, int]] = {}
        for actor in [hold, *ids]:
            cid = await runtime.mint_command_id()
            warmed[cid] = (actor, await runtime.get(Counter, actor).with_command_id(cid).add(1))
        say("WARM " + json.dumps(warmed))
        await asyncio.to_thread(sys.stdin.readline)  # the parent's go-ahead
        paused = runtime.hooks.pause_next("before_shared_write")
        first = asyncio.create_task(runtime.get(Counter, hold).add(1))
        await paused.wait()
        queued = []
        for n, actor in enumerate(ids, start=1):
            queued.append(asyncio.create_task(runtime.get(Counter, actor).add(10)))
            await line.reach(n)
        paused.release()
        say("SENT " + json.dumps(await first))
        await asyncio.Event().wait()  # until SIGKILL
    return 0


def main(argv: list[str]) -> int:
    """Dispatch on the mode."""
    match argv:
        case ["pause", url, schema, point, actor_id, cid, k]:
            return asyncio.run(pause(url, schema, point, actor_id, cid, int(k)))
        case ["serve-commands", url, schema, actor_id]:
            return asyncio.run(serve_commands(url, schema, actor_id))
        case ["shared-write", url, schema, hold, *ids] if ids:
            return asyncio.run(shared_write(url, schema, hold, ids))
        case _:
            sys.stderr.write(__doc__ or "")
            return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
