#!/usr/bin/env python3
"""Probe: the fastest sequential turn any Python client of akter's statements can reach.

    python bench/ceiling.py [--url URL] [--duration 8] [--reps 3] [--json FILE]

Without ``--url`` it starts a throwaway embedded PostgreSQL.

Issue 13's goal 2 asks a sequential akter turn (one caller, one warm actor) for 0.9 of pgbench
running the reference turn (``bench/sql/actor_turn.sql``, ``-D nactors=1 -c 1``). This probe
bounds what any Python client could reach with akter's statements, by driving them with no
runtime at all. Each rep runs, in a rotated order on one server:

* ``pgbench``: the reference turn script, as ``bench/turns.py`` runs it (5 round trips);
* ``reference``: the reference turn's statements through akter's ``TurnPipeline`` (the
  thinnest Python client there is: ``psycopg.pq``, prepared, 2 round trips);
* ``statements``: a warm akter turn's four statements through the same ``TurnPipeline``, with
  the parameters akter sends (``akter._store.gateway.actors``): ``BEGIN`` and ``lock_admit`` (its
  timeouts, the cached version, so no state is shipped, then the clock; no receipt probe, as for
  a command id minted for its call) in the first flight, ``update_actor_receipt`` and
  ``COMMIT`` in the second. The command id is a counter, the state and the outcome fixed
  strings: no validation, hashing, handler or telemetry;
* ``akter``: akter itself, ``Counter.add(1)`` awaited on one warm actor (``turns.py``'s
  sequential scenario), in a schema of its own.

``statements / pgbench`` is then a ceiling for akter's sequential ratio on this server: the rest
of an akter turn (the caller's checks, the handler, the runtime's tasks) only adds to it. Each
akter schema is analyzed after 1,000 warm turns, as autovacuum would have analyzed it by then.
Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from psycopg_floor import _psycopg_connect, pq_pipelined
from server_cost import SCHEMA, prepare
from turns import (
    Counter,
    CpuWindow,
    _drop_schema,
    _pgbench_args,
    _pgbench_number,
    _pgbench_schema,
    _run_pgbench,
    on_a_server,
)

import akter
from akter._store.gateway import actors
from akter._store.queries import Queries

REFERENCE_SCHEMA = "akter_ceiling_ref"
RUNTIME_SCHEMA = "akter_ceiling_runtime"
#: A receipt's lifetime here: any value in the future (the warm turn's receipts expire too).
_RECEIPT_MS = 86_400_000
#: Turns before the receipts are analyzed (see ``run``).
_WARM_TURNS = 1_000


class AkterStatements:
    """A warm turn's four statements on one actor, with akter's parameters and nothing else."""

    def __init__(self, conn: Any, settings: dict[str, str | None], key: dict[str, Any]) -> None:
        self.pipe = actors.turn_pipeline(conn)
        self.q = Queries(SCHEMA)
        self.settings = settings
        self.key = key
        self.version: int | None = None
        self.ids = itertools.count()

    async def turn(self) -> None:
        pipe, q, key = self.pipe, self.q, self.key
        command_id = f"ceiling-{next(self.ids)}"
        pipe.enter()
        await actors.begin_turn(pipe, q, None)
        # No id to probe: akter's call minted it (Request.unseen), as Counter.add(1)'s is.
        lock = await actors.lock_admit(pipe, q, key, self.version, self.settings, 0, [])
        await pipe.sync()
        locked = await lock.fetchone()
        assert locked is not None and locked[6] is None  # no receipt stored
        version, now_ms = int(locked[0]), int(locked[5])
        receipts = actors.one_receipt_params(  # one command: update_actor_receipt
            command_id=command_id,
            command="add",
            payload_hash="0" * 64,
            caller_key="local-anonymous",
            outcome='{"ok": 1}',
            expires=now_ms + _RECEIPT_MS,
        )
        await actors.update_actor(
            pipe,
            q,
            key,
            state_json='{"n": 1}',
            state_version=0,
            created=True,
            event_seq=0,
            now_ms=now_ms,
            locked_version=version,
            receipts=receipts,
        )
        await actors.end_turn(pipe, commit=True)
        await pipe.sync()
        pipe.leave()
        self.version = version + 1


async def _python_run(turn: Callable[[], Awaitable[None]], duration: float) -> dict[str, float]:
    """Sequential turns for ``duration`` s after a 1 s warm-up: turns/s and client CPU."""
    loop = asyncio.get_running_loop()
    for timed in (False, True):
        length = duration if timed else 1.0
        cpu = CpuWindow()
        start = loop.time()
        count = 0
        while loop.time() - start < length:
            await turn()
            count += 1
        seconds = loop.time() - start
        usage = cpu.close()
    return {
        "tps": count / seconds,
        "client_cpu_us": usage["bench_process_cores"] * seconds / count * 1e6,
    }


async def _pgbench(url: str, duration: int) -> dict[str, float]:
    """The reference turn under pgbench, with ``turns.py``'s arguments for 1 client, 1 actor."""
    args = [*_pgbench_args(nactors=1, clients=1), "-T", str(duration)]
    code, out, command = await _run_pgbench(url, REFERENCE_SCHEMA, args, duration + 60)
    tps = _pgbench_number(r"tps = ([\d.]+)", out)
    if code != 0 or tps is None:
        raise SystemExit(f"pgbench failed ({' '.join(command)}):\n{out}")
    return {"tps": tps}


async def _analyze(conn: Any, schema: str) -> None:
    ident = sql.Identifier(schema)
    await conn.execute(sql.SQL("ANALYZE {}.receipts, {}.actors").format(ident, ident))


async def run(args: argparse.Namespace, url: str) -> dict[str, list[dict[str, float]]]:
    settings = await prepare(url, 1)
    await _pgbench_schema(url, REFERENCE_SCHEMA)
    await _drop_schema(url, RUNTIME_SCHEMA)
    akter_conn = await _psycopg_connect(url, SCHEMA)
    ref_conn = await _psycopg_connect(url, REFERENCE_SCHEMA)
    runtime = akter.Runtime(actors=[Counter], database_url=url, schema=RUNTIME_SCHEMA)
    try:
        await runtime.start()
        counter = runtime.get(Counter, "ceiling-0")
        for _ in range(_WARM_TURNS):
            await counter.add(1)
        await _analyze(akter_conn, RUNTIME_SCHEMA)

        async def akter_turn() -> None:
            await counter.add(1)

        cur = await akter_conn.execute(
            sql.SQL("SELECT routing_key, tenant_id, actor_type, actor_id FROM {}.actors").format(
                sql.Identifier(SCHEMA)
            )
        )
        (rk, tenant, actor_type, actor_id), *_ = await cur.fetchall()
        statements = AkterStatements(
            akter_conn, settings, actors.actor_key(rk, tenant, actor_type, actor_id)
        )

        # As autovacuum would have by then: statistics of a table with receipts in it. Analyzed
        # with the one receipt ``prepare`` leaves, the probe's plan ties between the receipts'
        # key and their expiry index, and the expiry index reads every receipt of the type.
        for _ in range(_WARM_TURNS):
            await statements.turn()
        await _analyze(akter_conn, SCHEMA)

        async def reference_turn() -> None:
            await pq_pipelined(ref_conn, 1)

        variants = {
            "pgbench": lambda: _pgbench(url, int(args.duration)),
            "reference": lambda: _python_run(reference_turn, args.duration),
            "statements": lambda: _python_run(statements.turn, args.duration),
            "akter": lambda: _python_run(akter_turn, args.duration),
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        names = list(variants)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                result = await variants[name]()
                runs[name].append(result)
                print(f"rep {rep + 1} {name}: {result}", file=sys.stderr, flush=True)
        return runs
    finally:
        await runtime.stop()
        await akter_conn.close()
        await ref_conn.close()
        await _drop_schema(url, RUNTIME_SCHEMA)
        await _drop_schema(url, SCHEMA)
        await _drop_schema(url, REFERENCE_SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="append JSON lines here")
    args = parser.parse_args()
    runs = asyncio.run(on_a_server(args.url, lambda url: run(args, url)))
    pgbench = [r["tps"] for r in runs["pgbench"]]
    print(f"sequential, 1 client, 1 actor, {args.duration:g} s x {args.reps} reps (rotated)")
    print("| variant | turns/s (runs) | / pgbench of the same rep | client CPU µs/turn |")
    print("|---|---|---|---|")
    for name, results in runs.items():
        tps = [r["tps"] for r in results]
        ratios = [t / p for t, p in zip(tps, pgbench, strict=True)]
        cpu = [r["client_cpu_us"] for r in results if "client_cpu_us" in r]
        print(
            f"| {name} | {statistics.median(tps):,.0f} ({', '.join(f'{t:,.0f}' for t in tps)}) "
            f"| {min(ratios):.2f}–{max(ratios):.2f} "
            f"| {f'{statistics.median(cpu):.0f}' if cpu else '–'} |"
        )
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps({"args": vars(args), "runs": runs}) + "\n")


if __name__ == "__main__":
    main()
