#!/usr/bin/env python3
"""Probe: what akter's warm-turn statements cost the server, beside the reference turn script.

    python bench/server_cost.py --url URL [--duration 8] [--reps 3] [--clients 1]
                                [--actors 2000] [--json bench/results/server-cost.jsonl]

pgbench runs akter's own turn statements, taken from the statement catalogue at run time
(``lock_admit``, ``update_actor_receipt``, and for the variants ``update_actor_receipts``,
``lock_actor``, ``admission_read``, ``update_actor``), on a real akter schema of ``--actors``
warm ``Counter`` actors, with ``-M prepared`` (akter prepares its turn statements too). Each
variant leaves one piece out, so the difference in server time per turn is that piece's cost:

* ``akter``: ``BEGIN``, ``lock_admit``, ``update_actor_receipt``, ``COMMIT`` (a warm turn's
  four statements, for a command id minted for its call: no receipt probe, one receipt);
* ``arrays``: the receipt written as one-element arrays (``update_actor_receipts``, a batch's);
* ``pinned``: the same with the command's receipt probe (a pinned id, a retry, a delivery);
* ``split``: the lock and the receipt probe as two statements (``lock_actor``,
  ``admission_read``), as before migration 0011 and as Citus still sends them;
* ``no_settings``: ``lock_admit`` without its ``set_config`` filter (the turn's three
  transaction-local timeouts);
* ``no_probe``: ``lock_actor`` (no clock, no receipt probe);
* ``no_receipt``: ``update_actor`` instead of ``update_actor_receipt`` (no receipt row);
* ``keys``: only the lookup that picks the actor (every akter variant runs it first, so its
  cost is in each of them);
* ``reference``: ``bench/sql/actor_turn.sql`` on its own schema (``actor_schema.sql``).

The lock ships the actor's state (its cached version is given as -1, as a cold cache's would
be): pgbench cannot carry the NULL a warm turn gets. pgbench sends one statement per round trip,
where akter pipelines them in two, so per-round-trip costs are in every variant alike.

Server time per turn = the machine's busy CPU over the run minus pgbench's own CPU, per
transaction: it also holds whatever else ran, so read the differences between variants of the
same rep, and the spread between reps. Variants run in a rotated order in each rep. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import SQL_DIR, Counter, _connect, _drop_schema, _machine_jiffies, _pgbench_schema

import akter
from akter._engine.turn import admission
from akter._engine.turn.types import SERVER_BOUND_GRACE_MS
from akter._store.gateway import actors
from akter._store.queries import raw_catalogue

SCHEMA = "akter_server_cost"
REFERENCE_SCHEMA = "akter_server_cost_ref"

#: pgbench text for each catalogue parameter. Literals hold no ``:`` before a letter or digit:
#: pgbench's prepared mode would take it for a variable, even inside quotes.
_COMMAND_ID = "'cmd-' || :c || '-' || :client_id"
_STATE = "'{\"n\": 1}'"


def _params(settings: dict[str, str | None]) -> dict[str, str]:
    return {
        "rk": ":rk",
        "tenant": "'default'",
        "type": "'Counter'",
        "id": ":id",
        "cached_version": "-1",
        "off": "0",
        "command_ids": f"ARRAY[{_COMMAND_ID}]",
        "no_ids": "'{}'",  # what a minted id's lock_admit probes (Request.unseen)
        "state": _STATE,
        "state_version": "0",
        "created": "true",
        "event_seq": "0",
        "now": "1764900000000",
        "locked_version": ":version",
        "commands": "ARRAY['add']",
        "payload_hashes": "ARRAY['" + "0" * 64 + "']",
        "caller_keys": "ARRAY['local-anonymous']",
        "outcomes": "ARRAY['{\"ok\": 1}']",
        "expires": "ARRAY[1764990000000]",
        "command_id": _COMMAND_ID,
        "command": "'add'",
        "payload_hash": "'" + "0" * 64 + "'",
        "caller_key": "'local-anonymous'",
        "outcome": "'{\"ok\": 1}'",
        "expires_at_ms": "1764990000000",
        **{name: "NULL" if value is None else f"'{value}'" for name, value in settings.items()},
    }


def _statement(name: str, params: dict[str, str], edit: Callable[[str], str] | None = None) -> str:
    """A catalogue statement with pgbench's variables and literals for its parameters."""
    text = raw_catalogue()[name].replace("{schema}", SCHEMA)
    if edit is not None:
        text = edit(text)

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in params:
            raise SystemExit(f"{name} takes %({key})s, which this probe does not know: update it")
        return params[key]

    return re.sub(r"%\((\w+)\)s", value, text).rstrip().rstrip(";")


def _without_settings(text: str) -> str:
    edited, found = re.subn(r"\n\s*AND \(SELECT set_config\(.*?IS NOT NULL\)", "", text, flags=re.S)
    if found != 1:
        raise SystemExit("lock_admit no longer sets the timeouts as this probe expects")
    return edited


def _unprobed(text: str) -> str:
    """lock_admit probing no id, as the turn of an id minted for its call does."""
    return text.replace("%(command_ids)s", "%(no_ids)s")


def _unprobed_unset(text: str) -> str:
    return _unprobed(_without_settings(text))


def scripts(settings: dict[str, str | None]) -> dict[str, str]:
    """The pgbench scripts by variant name."""
    p = _params(settings)
    keys = (
        "\\set n random(1, :nactors)\n"
        "\\set c random(1, 2000000000)\n"
        f"SELECT rk, id FROM {SCHEMA}.probe_keys WHERE n = :n \\gset\n"
    )
    lock = _statement("lock_admit", p, _unprobed) + " \\gset\n"
    write = _statement("update_actor_receipt", p) + ";\n"

    def turn(lock: str = lock, read: str = "", write: str = write) -> str:
        return keys + "BEGIN;\n" + lock + read + write + "COMMIT;\n"

    return {
        "akter": turn(),
        "pinned": turn(lock=_statement("lock_admit", p) + " \\gset\n"),
        "arrays": turn(write=_statement("update_actor_receipts", p) + ";\n"),
        "split": turn(
            lock=_statement("lock_actor", p) + " \\gset\n",
            read=_statement("admission_read", p) + ";\n",
        ),
        "no_settings": turn(lock=_statement("lock_admit", p, _unprobed_unset) + " \\gset\n"),
        "no_probe": turn(lock=_statement("lock_actor", p) + " \\gset\n"),
        "no_receipt": turn(write=_statement("update_actor", p) + ";\n"),
        "keys": keys,
        "reference": (SQL_DIR / "actor_turn.sql").read_text(),
    }


async def prepare(url: str, count: int) -> dict[str, str | None]:
    """The akter schema with ``count`` warm actors and its key table; the type's settings."""
    await _drop_schema(url, SCHEMA)
    async with akter.Runtime(actors=[Counter], database_url=url, schema=SCHEMA) as runtime:
        gate = asyncio.Semaphore(32)

        async def warm(i: int) -> None:
            async with gate:
                await runtime.get(Counter, f"c-{i}").add(1)

        await asyncio.gather(*(warm(i) for i in range(count)))
        definition = runtime.definition(Counter)
        version = runtime._store.server_version
    policy = definition.policy
    settings = actors.turn_settings(
        lock_wait_ms=policy.lock_wait,
        statement_timeout_ms=policy.execution_timeout,
        bound_setting=admission.bound_setting(version),
        bound_ms=policy.execution_timeout + SERVER_BOUND_GRACE_MS,
        generic_plans=True,
    )
    async with await _connect(url) as conn:
        ident = sql.Identifier(SCHEMA)
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {}.probe_keys AS SELECT row_number() OVER (ORDER BY actor_id)::int"
                " AS n, routing_key AS rk, actor_id AS id FROM {}.actors"
            ).format(ident, ident)
        )
        await conn.execute(sql.SQL("ALTER TABLE {}.probe_keys ADD PRIMARY KEY (n)").format(ident))
        await conn.execute(sql.SQL("VACUUM ANALYZE {}.actors, {}.receipts").format(ident, ident))
        await conn.execute(sql.SQL("VACUUM ANALYZE {}.probe_keys").format(ident))
    await _pgbench_schema(url, REFERENCE_SCHEMA)
    return settings


def run_pgbench(url: str, script: Path, schema: str, args: argparse.Namespace) -> dict[str, Any]:
    """One timed pgbench run: transactions/s, pgbench's CPU and the rest of the machine's."""
    nactors = args.actors if schema == SCHEMA else 10_000
    command = [
        "pgbench", "-n", "-M", "prepared", "-f", str(script), "-D", f"nactors={nactors}",
        "-c", str(args.clients), "-j", str(min(args.clients, 2)), "-T", str(args.duration), url,
    ]  # fmt: skip
    env = {**os.environ, "PGOPTIONS": f"-c search_path={schema}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, _ = _machine_jiffies()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    busy1, _ = _machine_jiffies()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    if done.returncode != 0 or found is None or "error" in done.stderr.lower():
        raise SystemExit(f"pgbench failed on {script.name}:\n{done.stdout}\n{done.stderr}")
    tx = int(found.group(1))
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    busy = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
    return {
        "tps": tx / wall,
        "client_us": client / tx * 1e6,
        "server_us": (busy - client) / tx * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--actors", type=int, default=2000)
    parser.add_argument("--json", help="append JSON lines here")
    args = parser.parse_args()
    if shutil.which("pgbench") is None:
        raise SystemExit("pgbench is not on PATH")
    settings = asyncio.run(prepare(args.url, args.actors))
    folder = Path(tempfile.mkdtemp(prefix="akter-server-cost-"))
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        variants = scripts(settings)
        for name, text in variants.items():
            (folder / f"{name}.sql").write_text(text)
        names = list(variants)
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                schema = REFERENCE_SCHEMA if name == "reference" else SCHEMA
                result = run_pgbench(args.url, folder / f"{name}.sql", schema, args)
                runs.setdefault(name, []).append(result)
                print(f"rep {rep + 1} {name}: {result}", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        asyncio.run(_drop_schema(args.url, SCHEMA))
        asyncio.run(_drop_schema(args.url, REFERENCE_SCHEMA))
    akter_server = statistics.median(r["server_us"] for r in runs["akter"])
    print(f"pgbench -M prepared, {args.clients} client(s), {args.duration} s x {args.reps} reps")
    print("| variant | turns/s | server µs/turn (median; runs) | vs akter | pgbench µs/turn |")
    print("|---|---|---|---|---|")
    for name, results in runs.items():
        server = [r["server_us"] for r in results]
        median = statistics.median(server)
        print(
            f"| {name} | {statistics.median(r['tps'] for r in results):,.0f} "
            f"| {median:.0f} ({', '.join(f'{s:.0f}' for s in server)}) "
            f"| {median - akter_server:+.0f} "
            f"| {statistics.median(r['client_us'] for r in results):.0f} |"
        )
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps({"args": vars(args), "runs": runs}) + "\n")


if __name__ == "__main__":
    main()
