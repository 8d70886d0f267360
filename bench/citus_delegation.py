#!/usr/bin/env python3
"""Probe (issue 45): a Citus turn as its statements, or as one delegated function call.

    python bench/citus_delegation.py --url postgresql://postgres@127.0.0.1:9700/test \
        [--plain postgresql://postgres@127.0.0.1:5432/test] [--duration 8] [--clients 16] \
        [--actors 1000] [--reps 2]

On Citus every statement of a turn goes through the coordinator, which plans it and sends it
to the worker holding the actor's shard; there it is planned again. akter's Citus turn is two
flights of such statements (``BEGIN``, the actor row's lock and the coordinator's clock; then
the guarded update, the receipt, ``COMMIT``), and the coordinator's CPU per turn, not the
workers', is what bounds it (docs/benchmarks.md, "Citus turns in one phase"). The design
change this probe measures before anything is built: the same writes as one call of a
function distributed by the actor's routing key (``create_distributed_function``), sent
outside a transaction block, which Citus delegates whole to the worker, where it runs as one
local transaction.

Three sides, alternated, in one scratch schema of the same cluster (an actors-like and a
receipts-like table, 32 shards, colocated), each client owning its own actors (no conflicts):

- ``statements``: akter's Citus turn today — ``BEGIN``, ``SELECT ... FOR UPDATE``, ``SELECT
  now()`` (one pipelined flight), then ``UPDATE`` (guarded by version), ``INSERT`` receipt,
  ``COMMIT`` (a second);
- ``one flight``: the same statements in one pipelined flight (what a warm one-flight turn
  sends on plain PostgreSQL; not allowed on Citus today);
- ``delegated``: ``SELECT turn(...)``, one statement, the function doing the guarded update
  and the receipt on the worker (it raises on a stale version, as the guard does).

With ``--plain``, the ``one flight`` side also runs on a plain PostgreSQL server (the same
tables, not distributed; the same statements as akter's warm one-flight turn there): the
reference the issue's Citus goal ("turns within 0.5× plain") is read against.

Prints turns/s, p50 and CPU per turn of the coordinator, the workers and this client (the
nodes' ``/proc`` time, as ``citus_bench.py`` reads it). Not a test; nothing of akter runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from citus_bench import CpuMeter, _nodes

SIDES = ("statements", "one flight", "delegated")

#: The scratch schema's statements, run one by one (a function body has its own semicolons).
SETUP = """
CREATE SCHEMA {s}
---
CREATE TABLE {s}.actors (
    routing_key bigint NOT NULL, tenant text NOT NULL, type text NOT NULL, id text NOT NULL,
    version bigint NOT NULL, state jsonb NOT NULL,
    PRIMARY KEY (routing_key, tenant, type, id))
---
CREATE TABLE {s}.receipts (
    routing_key bigint NOT NULL, tenant text NOT NULL, type text NOT NULL, id text NOT NULL,
    command_id text NOT NULL, outcome jsonb NOT NULL, created_ms bigint NOT NULL,
    PRIMARY KEY (routing_key, tenant, type, id, command_id))
---
SELECT create_distributed_table('{s}.actors', 'routing_key', shard_count := 32)
---
SELECT create_distributed_table('{s}.receipts', 'routing_key', colocate_with := '{s}.actors')
---
CREATE FUNCTION {s}.turn(rk bigint, t text, ty text, i text, expected bigint, new_state jsonb,
                         cid text, outcome jsonb, now_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE v bigint;
BEGIN
    UPDATE {s}.actors SET version = version + 1, state = new_state
     WHERE routing_key = rk AND tenant = t AND type = ty AND id = i AND version = expected
    RETURNING version INTO v;
    IF v IS NULL THEN
        RAISE EXCEPTION 'the actor row moved' USING ERRCODE = 'P0001';
    END IF;
    INSERT INTO {s}.receipts VALUES (rk, t, ty, i, cid, outcome, now_ms);
    RETURN v;
END
$fn$
---
SELECT create_distributed_function(
    '{s}.turn(bigint, text, text, text, bigint, jsonb, text, jsonb, bigint)', 'rk',
    colocate_with := '{s}.actors')
"""

LOCK = (
    "SELECT version, state FROM {s}.actors"
    " WHERE routing_key = %s AND tenant = %s AND type = %s AND id = %s FOR UPDATE"
)
CLOCK = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
UPDATE = (
    "UPDATE {s}.actors SET version = version + 1, state = %s WHERE routing_key = %s"
    " AND tenant = %s AND type = %s AND id = %s AND version = %s RETURNING version"
)
RECEIPT = "INSERT INTO {s}.receipts VALUES (%s, %s, %s, %s, %s, %s, %s)"
CALL = "SELECT {s}.turn(%s, %s, %s, %s, %s, %s, %s, %s, %s)"


def _q(text: str, schema: str) -> sql.Composed:
    return sql.SQL(text).format(s=sql.Identifier(schema))


class Actor:
    __slots__ = ("id", "rk", "version")

    def __init__(self, rk: int, id: str) -> None:
        self.rk, self.id, self.version = rk, id, 1


async def _setup(url: str, schema: str, actors: int, citus: bool) -> list[Actor]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for statement in SETUP.replace("{s}", f'"{schema}"').split("\n---\n"):
            if statement.strip() and (citus or "create_distributed" not in statement):
                await conn.execute(statement)
        rows = [Actor(random.getrandbits(63), f"a-{i:05d}") for i in range(actors)]
        async with conn.cursor() as cur:
            await cur.executemany(
                _q(
                    "INSERT INTO {s}.actors VALUES (%s, 't', 'Counter', %s, 1, '{{\"n\": 0}}')",
                    schema,
                ),
                [(a.rk, a.id) for a in rows],
            )
    return rows


async def _turn(
    conn: psycopg.AsyncConnection[Any], side: str, schema: str, a: Actor, n: int
) -> None:
    key = (a.rk, "t", "Counter", a.id)
    state = f'{{"n": {n}}}'
    cid = uuid.uuid4().hex
    if side == "delegated":
        await conn.execute(
            _q(CALL, schema), (*key, a.version, state, cid, '{"ok": 1}', int(time.time() * 1000))
        )
        a.version += 1
        return
    async with conn.pipeline() as pipe:
        await conn.execute("BEGIN")
        lock = await conn.execute(_q(LOCK, schema), key)
        clock = await conn.execute(CLOCK)
        if side == "statements":
            await pipe.sync()  # the admission flight's answers before the handler
            await lock.fetchone()
            await clock.fetchone()
        update = await conn.execute(_q(UPDATE, schema), (state, *key, a.version))
        await conn.execute(_q(RECEIPT, schema), (*key, cid, '{"ok": 1}', int(time.time() * 1000)))
        await conn.execute("COMMIT")
        await pipe.sync()
        row = await update.fetchone()
        if side == "one flight":
            await lock.fetchone()
            await clock.fetchone()
    assert row is not None and row[0] == a.version + 1, "the guard failed"
    a.version += 1


async def _side(
    url: str, side: str, schema: str, actors: list[Actor], args: argparse.Namespace, citus: bool
) -> dict[str, Any]:
    owned = [actors[c :: args.clients] for c in range(args.clients)]
    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in owned]
    laps: list[float] = []
    meter = CpuMeter(await _nodes(url, citus=citus))
    try:
        for conn, mine in zip(conns, owned, strict=True):  # warm each connection and plan
            for a in mine[:3]:
                await _turn(conn, side, schema, a, 0)
        stop = time.monotonic() + args.duration
        meter.start()

        async def client(conn: psycopg.AsyncConnection[Any], mine: list[Actor]) -> None:
            n = 0
            while time.monotonic() < stop:
                n += 1
                began = time.perf_counter()
                await _turn(conn, side, schema, mine[n % len(mine)], n)
                laps.append(time.perf_counter() - began)

        began = time.monotonic()
        await asyncio.gather(*(client(c, m) for c, m in zip(conns, owned, strict=True)))
        wall = time.monotonic() - began
        cpu = meter.stop(len(laps))["cpu_ms_per_turn"]
    finally:
        for conn in conns:
            await conn.close()
    laps.sort()
    return {
        "side": side,
        "turns_s": len(laps) / wall,
        "p50_ms": 1000 * laps[len(laps) // 2],
        "coordinator": cpu.get("coordinator", cpu.get("server", float("nan"))),
        "workers": sum(v for k, v in cpu.items() if k.startswith("worker:")),
        "client": cpu["client"],
    }


async def main_async(args: argparse.Namespace) -> None:
    schema = f"akter_delegation_{uuid.uuid4().hex[:8]}"
    actors = await _setup(args.url, schema, args.actors, citus=True)
    plain = await _setup(args.plain, schema, args.actors, citus=False) if args.plain else None
    print(
        f"{args.clients} clients over {args.actors} actors, {args.duration:g} s per side, 32 shards"
    )
    print(
        "| rep | side | turns/s | p50 ms | coordinator (plain: server) CPU ms/turn"
        " | workers CPU ms/turn | client CPU ms/turn |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        for rep in range(1, args.reps + 1):
            runs = [(args.url, side, actors, True) for side in SIDES]
            if plain is not None:
                runs.insert(0, (args.plain, "one flight", plain, False))
            for url, side, rows, citus in runs:
                r = await _side(url, side, schema, rows, args, citus)
                where = "Citus" if citus else "plain"
                print(
                    f"| {rep} | {where}: {side} | {r['turns_s']:,.0f} | {r['p50_ms']:.2f} | "
                    f"{r['coordinator']:.2f} | {r['workers']:.2f} | {r['client']:.2f} |",
                    flush=True,
                )
    finally:
        for url in [args.url] + ([args.plain] if plain is not None else []):
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(_q("DROP SCHEMA {s} CASCADE", schema))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the Citus coordinator")
    parser.add_argument("--plain", help="a plain PostgreSQL server for the reference side")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--actors", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=2)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
