#!/usr/bin/env python3
"""Citus probe (issue 16): every catalogue statement, prepared, on a distributed schema.

    AKTER_TEST_CITUS_URL=postgresql://postgres@127.0.0.1:9700/test python bench/citus_probe.py
        [--url URL] [--runs 7] [--keep] [--only NAME ...]

Creates a fresh schema on the coordinator, applies the migrations, distributes it
(``akter._store.citus.distribute``: per-actor tables by ``routing_key``, co-located; the global
ones as reference tables), seeds one actor row, then runs each catalogue statement ``--runs``
times, each in its own rolled-back transaction, prepared on the server (so Citus's and
PostgreSQL's plan caches both see it after the fifth run). Parameters come from one table of
sample values by name (a list where the statement casts the parameter to an array). A statement
"passes" when it ran, or when it failed with an error of akter's own (the fence's 40001, a
foreign key): only Citus's refusals count as failures, except for the plain-only statements
(``akter._store.citus.PLAIN_ONLY``), whose Citus variants run instead and are probed too.
Prints one line per statement and the failures' errors; exits 1 when any failed. Nothing of
Citus itself is set up here: point it at a running coordinator with the ``citus`` extension
created.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

SELF = Path(__file__).resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SELF.parent]
sys.path.insert(0, str(SELF.parent.parent / "src"))

import psycopg  # noqa: E402

from akter._store.citus import PLAIN_ONLY, distribute, worker_lock_wait  # noqa: E402
from akter._store.migrate import migrate  # noqa: E402
from akter._store.queries import Queries  # noqa: E402

RK = 12345  # bucket 0 (rk >> 56)
RUNNER = str(uuid.uuid4())
#: Sample values by parameter name; a statement casting ``%(name)s::x[]`` gets ``[value]``.
SAMPLES: dict[str, Any] = {
    "actor_type": "T", "actor_types": "T", "after": 0, "after_id": "a", "after_tenant": "default",
    "ambiguous": False, "ats": None, "attempt": 1, "attempts": 1, "backoff": 1000, "batch": 100,
    "bound": "10s", "bound_setting": "idle_in_transaction_session_timeout", "bucket": 0,
    "cached_version": 0, "caller": "system", "caller_keys": "k", "callers": "system",
    "cancelled": False, "cap": 1, "cause": "x", "channel": "probe", "checksum": "x",
    "command": "cmd", "command_ids": "c1", "commands": "cmd", "created": True, "cutoff": 0,
    "delays": 0, "deployment_id": str(uuid.uuid4()), "draining": False, "due": 1, "dues": 1,
    "epoch": 0, "error": "e", "event_seq": 0, "expires": 1, "final": False, "free": 10,
    "http_address": None, "intent_id": "i1", "intent_ids": "i1", "job": "j", "job_id": "i1",
    "job_ids": "i1", "job_types": "j", "jobs": "j", "keys": "k", "kinds": "intent", "lease": 1000,
    "lease_ms": 1000, "limit": 10, "live_ms": 1000, "lock_name": "probe", "lock_timeout": "1s",
    "locked_version": 0, "max_attempts": 3, "max_backoff": 1000, "maybe_applied": False, "ms": 1,
    "new_id": "i2", "not_started": False, "now": 1, "off": 0, "ords": 0, "outcomes": "{}",
    "owner": RUNNER, "payload": "{}", "payload_hashes": "a" * 64, "payload_version": 0,
    "payloads": "{}", "placements": "{}", "probe": 10, "prune_ms": 1000,
    "retry_window_ms": 86_400_000, "rk": RK, "rks": RK, "route": "r", "runner_id": RUNNER,
    "schema_version": 4, "seqs": 1, "skew_ms": 1000, "state": "{}", "state_version": 0,
    "statement_timeout": "1s", "stuck": 3, "tags": "t", "target_ids": "a1", "target_types": "T",
    "tenant": "default", "timeout": "1s", "timer_keys": None, "token": 0, "tokens": 0,
    "traceparent": None, "type": "T", "types": "T", "version": "probe", "id": "a1",
    "table": "probe", "with": "default", "schema": "probe", "clock": 1, "rows": 1,
    # issue 12 (evolution): parked rows, the operator audit, versions, the name registry
    "audit_ids": "a1", "ids": None, "kind": "intent", "name": "n", "names": "n",
    "operator": "probe", "payload_versions": 0, "prior_ambiguous": False, "prior_attempts": 0,
    "prior_maybe_applied": False, "reason": "probe", "seq": 0, "versions": 0, "wait": 1000,
    "with_state": True,
    # issue 13 (one clock per turn) and issue 17 (flow control)
    "commit": 1, "priorities": 0, "max_waits": None, "caps": 1,
    # issue 15 (workflows)
    "run_id": "r1", "workflow": "w", "input": "{}", "input_hash": "a" * 64, "key": None,
    "delay_ms": 0, "timeout_ms": 1000, "details": "{}", "keep_ms": 1000, "runner": RUNNER,
    "signal_id": "s1", "signal_ids": "s1", "signal_seqs": 0, "status": "completed",
    "statuses": "running", "result": "{}", "outcome": "{}", "target": "t", "wake_at": None,
    "waiting": None,
    # issue 38: a turn's workflow starts (wf_start_in_turn; wf_live_keys takes the actor's key)
    "run_ids": "r1", "workflows": "w", "inputs": "{}", "input_hashes": "a" * 64,
    "timeouts": 1000,
    # flow control on Citus: one rate bucket per statement ("key": see OVERRIDES)
    "no": 0, "burst": 2.0, "per_ms": 0.001, "n": 1, "prior_error": None,
    # issue 13: one receipt as scalars (update_actor_receipt)
    "command_id": "c1", "payload_hash": "a" * 64, "caller_key": "k", "expires_at_ms": 1,
    # parameters that ran as NULL until issue 38's Citus pass: the deadline-capped suspend, the
    # fence's clock check (a lease ending far ahead: the check passes), the rate takes' horizon
    # and the plain take's arrays, the group and turn settings, the capped claims' slots
    "by_deadline": True, "lease_until": 2**62, "horizon_ms": 1000, "bursts": 2.0, "nos": 0,
    "wants": 1, "idle_bound": "1s", "plan_cache_mode": "force_custom_plan", "slots": 1,
    "tenants": "default", "prior_errors": None, "waits": 1000,
    # the runners' models (migration 0014): a registration's JSON, a model's name
    "models": '{"T": {"version": 0, "model": "v0:probe", "paths": [], "commands": [], "jobs": []}}',
    "model": "v0:probe",
    # job output streams (migration 0018): one chunk of a batch, the writer's expected seq
    "data": '"x"', "expect": None, "if_begun": False,
    # issue 44 (owned tables): the start check's Citus read names the routing key column
    "column": "routing_key",
    # issue 45: a Citus turn's rows one routed statement each (citus_insert_event, ...)
    "target_type": "T", "target_id": "a1", "tag": "t", "at": None, "priority": 0,
    "max_wait": None, "timer_key": None, "run_key": None, "head": 1, "floor": 0,
    # issue 41: commands staged in an application's transaction (migration 0015)
    "pinned": None, "uuids": str(uuid.uuid4()), "suffixes": "", "slacks": 0, "min_version": 0,
    "uuid": str(uuid.uuid4()), "suffix": "", "slack": 0,
    "delay": None,
    # issue 40: subscriptions (feeds, follows, applied cursors, the recorded subscriptions)
    "heads": 1, "floors": 0, "subscription": "S.on", "subscriptions": "S.on", "subscriber": "s1",
    "source_type": "T", "source_types": "T", "source_id": "a1", "source_ids": "a1",
    "cursors": 1, "done": 0, "held": 0, "shape": "routed", "start": "now",
}  # fmt: skip
#: Not probed: DDL of distribution itself, LISTEN/NOTIFY (no table), multi-statement blocks.
SKIP = frozenset(
    {
        "citus_create_reference", "citus_create_distributed", "listen_wake", "notify_wake",
        "listen_progress", "migrations_bootstrap",
        # Run by ``distribute`` on the local lease table before it is placed (test_citus.py).
        "citus_undistribute", "singletons_key", "singletons_rekey",
        # Needs the savepoint owned_rows_savepoint takes first in the same turn (probed alone).
        "owned_rows_undo",
    }
)  # fmt: skip
#: Statements the gateways never send to Citus, and what runs instead.
NOT_ON_CITUS: dict[str, str] = {
    "any_due": "the idle probe answers due on Citus (the claims run)",
    "next_due": "the idle probe answers due on Citus (the claims run)",
    "count_intent_backlog": "count_intent_backlog_flat (one clock read, a flat scan)",
    "lock_admit": "lock_actor, admission_read and clock_now (admission_receipts would query a "
    "distributed table from inside a shard)",
    "vacuum_outbox": "the lean watch runs on plain PostgreSQL only (the workers' autovacuum keeps "
    "the shards, with migration 0021's settings)",
    "vacuum_actors": "the lean watch runs on plain PostgreSQL only (the workers' autovacuum keeps "
    "the shards)",
    "xmin_horizon": "the lean watch runs on plain PostgreSQL only (the coordinator's sessions do "
    "not hold the workers' horizons)",
    "turn_guard": "the two-flight turn (a warm turn takes one flight only on plain PostgreSQL; "
    "the guard's receipt probe is admission_receipts)",
}
#: SQLSTATEs of akter's own refusals (not Citus's): the fence, foreign keys, unique keys.
OWN = frozenset({"40001", "23503", "23505", "55P03", "22012"})


#: Samples that differ for one statement (a parameter name used with two types).
OVERRIDES: dict[str, dict[str, Any]] = {
    "rewrite_tick": {"version": 0},  # the payload version here, a runner's version elsewhere
    "names_record": {"kinds": "command"},  # the registry's kinds, not an outbox row's
    "citus_rate_take": {"key": "k"},  # a rate bucket's key (NOT NULL), not a workflow's
    "live_state_paths": {"version": 0},  # a state version here, a runner's version elsewhere
    "stream_append": {"kinds": "chunk"},  # a stream item's kind, not an outbox row's
    "citus_insert_event": {"seq": 1},  # an event's seq starts at 1 (events_seq_check)
    "stage_intents": {"ids": "a1"},  # the target actors' ids, not a parked-row selection
    "stage_intent": {"version": 0},  # a payload version here, a runner's version elsewhere
    "stage_probe": {"ids": "a1"},
    # a feed's claim token is text (the relay's is its lease end)
    "sub_feed_claim": {"token": "t1"},
    "sub_feed_settle": {"token": "t1"},
    "sub_feed_park": {"token": "t1"},
}


def params_for(statement: str, name_of: str = "") -> dict[str, Any]:
    """The sample parameters of one statement."""
    out: dict[str, Any] = {}
    for name in set(re.findall(r"%\((\w+)\)s", statement)):
        value = OVERRIDES.get(name_of, {}).get(name, SAMPLES.get(name))
        is_array = re.search(rf"%\({name}\)s::\w+\[\]", statement)
        out[name] = [value] if is_array else value
    return out


async def probe(url: str, runs: int, keep: bool, only: list[str]) -> int:
    """Run the probe; the number of statements Citus refused."""
    schema = f"akter_probe_{uuid.uuid4().hex[:8]}"
    queries = Queries(schema)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    failed = 0
    try:
        await migrate(conn, queries, retry_window_ms=86_400_000, placements={})
        done = await distribute(conn, queries, {})
        print(f"schema {schema}: distributed {done.distributed}, reference {done.referenced}")
        await conn.execute(
            queries["ensure_actor"],
            {"rk": RK, "tenant": "default", "type": "T", "id": "a1", "state": "{}",
             "state_version": 0, "off": 0},
        )  # fmt: skip
        names = only or sorted(n for n in queries.names() if n not in SKIP)
        for name in names:
            # SET takes no parameter: the lock wait is formatted in as its callers do.
            text = worker_lock_wait(queries, 100) if name == "citus_lock_wait" else queries[name]
            error = await _run(conn, text, runs, name)
            if error is None:
                print(f"ok    {name}")
            elif name in PLAIN_ONLY:
                print(f"plain {name} (on Citus: {', '.join(PLAIN_ONLY[name])}): {error}")
            elif name in NOT_ON_CITUS:
                print(f"skip  {name} (on Citus: {NOT_ON_CITUS[name]}): {error}")
            else:
                failed += 1
                print(f"FAIL  {name}: {error}")
    finally:
        if not keep:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
    print(f"{failed} of {len(names)} statements refused by Citus")
    return failed


async def _run(
    conn: psycopg.AsyncConnection[Any], statement: Any, runs: int, name: str = ""
) -> str | None:
    params = params_for(statement, name) if isinstance(statement, str) else {}
    for _ in range(runs):
        try:
            async with conn.transaction(force_rollback=True):
                await conn.execute(statement, params, prepare=True)
        except psycopg.Error as exc:
            if exc.sqlstate in OWN:
                continue
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return f"[{exc.sqlstate}] {first}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("AKTER_TEST_CITUS_URL"))
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the probe schema")
    parser.add_argument("--only", nargs="*", default=[], help="probe only these statements")
    args = parser.parse_args()
    if not args.url:
        sys.exit("Set AKTER_TEST_CITUS_URL (a Citus coordinator) or pass --url.")
    sys.exit(1 if asyncio.run(probe(args.url, args.runs, args.keep, args.only)) else 0)


if __name__ == "__main__":
    main()
