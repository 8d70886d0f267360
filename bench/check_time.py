"""How long ``akter check`` takes per 100,000 actors (evolution E5; docs/benchmarks.md).

Seeds ``--actors`` actor rows directly with SQL (states at state version 0, so every full-check
decode runs the state migration and the loss guard), plus one pending intent per 100 actors,
then times ``akter check bench.check_time:runtime --json`` as a subprocess (what an operator
runs: interpreter start, import, connect, every scan) with and without ``--sample 100``, the
same checks in-process (``await runtime.check(...)``), and ``akter check --help`` (the start-up
cost alone).

    PYTHONPATH=$PWD/src /work/main/.venv/bin/python bench/check_time.py \
        --url postgresql://postgres@127.0.0.1:5432/test --actors 100000 --reps 3

This file is also the checked application (``runtime`` below, configured from the
environment by the script itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel

import akter

ROOT = Path(__file__).resolve().parents[1]
AKTER = str(Path(sys.executable).parent / "akter")


class Person(BaseModel):
    first: str = ""
    last: str = ""
    balance: int = 0


class Account(akter.Actor[Person], name="Account"):
    @akter.migrate_state(from_version=0)
    def _split(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old.pop("name", "").partition(" ")
        return {**old, "first": first, "last": last}

    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.balance += cents
        return self.state.balance


runtime = akter.Runtime(
    [Account],
    database_url=os.environ.get("CHECK_BENCH_URL"),
    schema=os.environ.get("CHECK_BENCH_SCHEMA", "check_bench"),
)

SEED_ACTORS = """
INSERT INTO {schema}.actors (routing_key, tenant_id, actor_type, actor_id, version, created,
    event_seq, state, state_version, updated_at_ms)
SELECT (i::bigint * 7919 * 1000003) %% 9223372036854775807, 'default', 'Account',
       'a-' || i, 1, true, 0,
       jsonb_build_object('name', 'Ada Lovelace ' || i, 'balance', i), 0, 0
FROM generate_series(1, %(n)s) AS i
"""
SEED_OUTBOX = """
INSERT INTO {schema}.outbox (routing_key, intent_id, bucket, kind, tenant_id, actor_type,
    actor_id, target_type, target_id, command, payload, payload_version, caller, due_at_ms,
    scheduled_at_ms)
SELECT a.routing_key, 'i-' || a.actor_id, (a.routing_key >> 56)::smallint, 'intent', 'default',
       'Account', a.actor_id, 'Account', a.actor_id, 'deposit', '{"cents": 1}', 0,
       '{"kind": "system"}', 9000000000000, 0
FROM {schema}.actors a WHERE a.actor_id LIKE '%%00'
"""


async def seed(url: str, schema: str, actors: int) -> None:
    """A migrated schema (a runtime starts once) with ``actors`` rows written by SQL."""
    seeder = akter.Runtime(
        [Account], database_url=url, schema=schema, relay=False, maintenance=False, jobs=[]
    )
    async with seeder:
        pass
    queries = seeder.store.queries
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(queries.substitute(SEED_ACTORS), {"n": actors})
        await conn.execute(queries.substitute(SEED_OUTBOX))
        await conn.execute(queries.substitute("ANALYZE {schema}.actors, {schema}.outbox"))


def timed_check(url: str, schema: str, *args: str) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "CHECK_BENCH_URL": url, "CHECK_BENCH_SCHEMA": schema}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    done = subprocess.run(
        [AKTER, "check", "bench.check_time:runtime", "--json", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"akter check failed ({done.returncode}): {done.stderr}")
    return elapsed, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("AKTER_DATABASE_URL"), required=False)
    parser.add_argument("--actors", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    ns = parser.parse_args()
    if not ns.url:
        raise SystemExit("Give --url (or set AKTER_DATABASE_URL).")
    schema = f"check_bench_{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    asyncio.run(seed(ns.url, schema, ns.actors))
    print(f"seeded {ns.actors:,} actors in {time.perf_counter() - started:.1f} s ({schema})")
    try:
        startup = []
        for _ in range(ns.reps):
            began = time.perf_counter()
            subprocess.run([AKTER, "check", "--help"], capture_output=True, check=True)
            startup.append(time.perf_counter() - began)
        print(f"akter check --help: median {statistics.median(startup):.2f} s (start-up alone)")
        checked = akter.Runtime([Account], database_url=ns.url, schema=schema)
        for sample in (None, 100):
            times = []
            for _ in range(ns.reps):
                began = time.perf_counter()
                asyncio.run(checked.check(sample))
                times.append(time.perf_counter() - began)
            print(
                f"in-process sample={sample}: median {statistics.median(times):.2f} s "
                f"(min {min(times):.2f}, max {max(times):.2f})"
            )
        for label, args in (("full", ()), ("--sample 100", ("--sample", "100"))):
            times = []
            for _ in range(ns.reps):
                elapsed, report = timed_check(ns.url, schema, *args)
                times.append(elapsed)
            states = [f for f in report["findings"] if f["kind"] == "state_version"]
            per_100k = statistics.median(times) * 100_000 / ns.actors
            print(
                f"{label:>13}: median {statistics.median(times):.2f} s of {ns.reps} "
                f"(min {min(times):.2f}, max {max(times):.2f}); {per_100k:.2f} s per 100k "
                f"actors; ok={report['ok']}, states counted {sum(f['count'] for f in states):,}"
            )
    finally:
        with psycopg.connect(ns.url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
