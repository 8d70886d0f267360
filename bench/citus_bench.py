#!/usr/bin/env python3
"""Citus benchmark (issue 16): turns, intent latency and claim rate, distributed vs plain.

    python bench/citus_bench.py --url URL [--url URL ...] [--duration 10] [--callers 16]
                                [--actors 1000] [--drain 5000] [--json FILE]

For each ``--url`` (a plain PostgreSQL, or a Citus coordinator: the schema is then migrated and
distributed with ``akter citus distribute``'s own function before the runtime starts), on a
fresh schema dropped afterwards:

1. **Turns.** ``--callers`` concurrent callers call ``add`` on random actors out of
   ``--actors`` of one tenant (``--placement actor``: they spread over shards; ``tenant``, the
   default placement: one tenant, so one shard), every actor warmed first, for ``--duration``
   s: turns/s, p50 and p99 of the call. ``--emit``: each turn also emits an event, a row
   written beside the state (on Citus it must stay on the actor's worker connection, or the
   commit is two-phase).
2. **Intent latency.** 4 senders call ``Sender.fire`` back to back (one intent each to a random
   pre-warmed receiver) for ``--duration`` s; latency is the receiver's handler time minus the
   sender's return time (an upper bound of commit → delivery, both ``time.monotonic()`` here;
   before 2026-12-07 it was taken from the sender's call, so it held the sender's own turn too:
   that figure is still printed, as "from the send").
   Back to back, the senders offer more intents than a Citus relay claims (step 3), so there
   the figure is mostly the backlog's wait: a throughput in disguise. So it runs once more with
   the 4 senders paced to ``--rate`` intents/s in all (default 50, below both servers' claim
   rates): the latency of an intent that does not queue behind others.
3. **Claim rate.** ``--drain`` intents due at once are staged (100 per turn) by a runtime with
   its relay off; the relay is then started and the time until every one was delivered gives
   intents/s (every claim is a claim pass: on Citus the scan and the single-shard claims).

Prints one line per measurement; ``--json`` appends one JSON object per URL. Given one plain
URL and one Citus URL, it ends with a table of both and their ratios beside issue 45's goals
(intent latency p50 on Citus within 3x plain, turns within 0.5x). ``--no-drain`` skips step 3.

Issue 45's run (a plain server and the local cluster of ``bench/citus_cluster.sh``)::

    PYTHONPATH=src python bench/citus_bench.py --duration 10 \
        --url postgresql://postgres@127.0.0.1:5432/test --url postgresql://postgres@127.0.0.1:9700/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SELF = Path(__file__).resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SELF.parent]
sys.path.insert(0, str(SELF.parent.parent / "src"))

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import akter  # noqa: E402
from akter._store.citus import detect_strategy  # noqa: E402
from akter._store.migrate import migrate_and_distribute  # noqa: E402
from akter._store.queries import Queries  # noqa: E402

RECEIVED: dict[str, float] = {}
#: Per send (keyed by its send time): when the receiver's handler ran, when the sender returned.
HANDLED: dict[float, float] = {}
RETURNED: dict[float, float] = {}


class CounterState(BaseModel):
    n: int = 0


class Added(akter.Event, tag="citus-bench.Added"):
    k: int


class Counter(akter.Actor[CounterState], placement="actor"):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n

    @akter.command
    async def add_noted(self, k: int) -> int:  # --emit: a turn that writes a row beside its state
        self.state.n += k
        self.emit(Added(k=k))
        return self.state.n


class TenantCounter(akter.Actor[CounterState]):  # placement="tenant", the default
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n

    @akter.command
    async def add_noted(self, k: int) -> int:
        self.state.n += k
        self.emit(Added(k=k))
        return self.state.n


class Receiver(akter.Actor[CounterState], placement="actor"):
    @akter.command
    async def got(self, sent_at: float) -> None:
        now = time.monotonic()
        RECEIVED.setdefault(self.command_id, now - sent_at)
        HANDLED.setdefault(sent_at, now)
        self.state.n += 1


class Sender(akter.Actor[CounterState], placement="actor"):
    @akter.command
    async def fire(self, rid: str, sent_at: float) -> None:
        self.send(Receiver.got, rid, sent_at)

    @akter.command
    async def stage(self, rids: list[str], at_ms: int) -> None:
        at = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
        for rid in rids:
            self.later(at=at).send(Receiver.got, rid, 0.0)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _is_citus(url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        return await detect_strategy(conn, Queries("akter")) == "citus"


async def _runtime(url: str, schema: str, citus: bool, **options: Any) -> akter.Runtime:
    runtime = akter.Runtime(
        [Counter, TenantCounter, Sender, Receiver], database_url=url, schema=schema, **options
    )
    if citus:
        services = runtime._services
        await migrate_and_distribute(
            url,
            runtime._store.queries,
            retry_window_ms=services.config.window_ms,
            placements={d.name: d.placement for d in services.definitions.values()},
        )
    return runtime


def _node_cpu_s(data_dir: str) -> float | None:
    """CPU seconds a local server has used: its postmaster, its live backends, its reaped ones.

    ``None`` when the data directory is not readable here (a remote server). Backends that ended
    count through the postmaster's ``cutime``/``cstime`` (it reaps them).
    """
    try:
        pid = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
        if proc.name == str(pid):
            total += sum(int(f) for f in fields[11:15])
        elif fields[1] == str(pid):
            total += int(fields[11]) + int(fields[12])
    return total / tick


async def _nodes(url: str, citus: bool) -> dict[str, str]:
    """Each node's data directory by role (``server``; or ``coordinator``, ``worker:<port>``)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute("SHOW data_directory")).fetchone()
        assert row is not None
        if not citus:
            return {"server": str(row[0])}
        nodes = {"coordinator": str(row[0])}
        cur = await conn.execute("SELECT node_name, node_port FROM citus_get_active_worker_nodes()")
        workers = await cur.fetchall()
    for host, port in workers:
        info = conninfo_to_dict(url) | {"host": host, "port": port}
        async with await psycopg.AsyncConnection.connect(**info, autocommit=True) as conn:
            row = await (await conn.execute("SHOW data_directory")).fetchone()
            assert row is not None
            nodes[f"worker:{port}"] = str(row[0])
    return nodes


class CpuMeter:
    """CPU seconds of this process and of each local server node over a measured phase."""

    def __init__(self, nodes: dict[str, str]) -> None:
        self._nodes = nodes
        self._start: dict[str, float | None] = {}

    def start(self) -> None:
        self._start = {role: _node_cpu_s(d) for role, d in self._nodes.items()}
        self._start["client"] = time.process_time()

    def stop(self, turns: int) -> dict[str, Any]:
        """CPU milliseconds per turn by role (``cpu_ms_per_turn``), where measurable."""
        used: dict[str, float] = {}
        for role, d in self._nodes.items():
            before, after = self._start.get(role), _node_cpu_s(d)
            if before is not None and after is not None:
                used[role] = after - before
        started = self._start["client"]
        assert started is not None
        used["client"] = time.process_time() - started
        per_turn = {role: 1000 * v / max(turns, 1) for role, v in used.items()}
        out: dict[str, Any] = {"cpu_ms_per_turn": per_turn}
        workers = [v for role, v in per_turn.items() if role.startswith("worker:")]
        if workers:
            # Worker vCPU time per turn, over every worker: the sizing note's denominator.
            out["turns_per_worker_vcpu_s"] = 1000 / sum(workers)
        if "server" in per_turn:
            out["turns_per_server_vcpu_s"] = 1000 / per_turn["server"]
        return out


async def turns(runtime: akter.Runtime, args: argparse.Namespace) -> dict[str, Any]:
    ids = [f"c-{i:05d}" for i in range(args.actors)]
    kind: type[Counter] | type[TenantCounter] = (
        TenantCounter if args.placement == "tenant" else Counter
    )
    for chunk in range(0, len(ids), 32):
        await asyncio.gather(*(runtime.get(kind, i).add(0) for i in ids[chunk : chunk + 32]))
    latencies: list[float] = []
    deadline = time.monotonic() + args.duration

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            started = time.perf_counter()
            handle = runtime.get(kind, ids[rng.randrange(len(ids))])
            await (handle.add_noted(1) if args.emit else handle.add(1))
            latencies.append((time.perf_counter() - started) * 1000)

    meter = CpuMeter(args.nodes)
    meter.start()
    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(args.callers)))
    elapsed = time.perf_counter() - started
    return meter.stop(len(latencies)) | {
        "turns_per_s": len(latencies) / elapsed,
        "turn_p50_ms": statistics.median(latencies),
        "turn_p99_ms": _pct(latencies, 0.99),
    }


async def latency(
    runtime: akter.Runtime, args: argparse.Namespace, rate: float | None = None
) -> dict[str, Any]:
    """Intent latency: 4 senders back to back (``rate`` None), or paced to ``rate`` intents/s."""
    rids = [f"r-{i:04d}" for i in range(200)]
    for chunk in range(0, len(rids), 32):
        await asyncio.gather(*(runtime.get(Receiver, r).got(0.0) for r in rids[chunk : chunk + 32]))
    RECEIVED.clear()
    HANDLED.clear()
    RETURNED.clear()
    started = time.monotonic()
    deadline = started + args.duration
    sent = 0

    async def sender(i: int) -> None:
        nonlocal sent
        rng = random.Random(i)
        handle = runtime.get(Sender, f"s-{i}")
        n = 0
        while time.monotonic() < deadline:
            if rate is not None:  # sender i's n-th intent is due at (n + i/4) * 4/rate
                due = started + (n + i / 4) * 4 / rate
                n += 1
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
            at = time.monotonic()
            await handle.fire(rids[rng.randrange(len(rids))], at)
            RETURNED[at] = time.monotonic()
            sent += 1

    await asyncio.gather(*(sender(i) for i in range(4)))
    end = time.monotonic() + 30
    while len(RECEIVED) < sent and time.monotonic() < end:  # noqa: ASYNC110 (a bench poll)
        await asyncio.sleep(0.01)
    sends = [v * 1000 for v in RECEIVED.values()]
    # After the sender's return: what the intent waited once its commit was acknowledged.
    values = [(HANDLED[k] - r) * 1000 for k, r in RETURNED.items() if k in HANDLED]
    prefix = "intent" if rate is None else "paced"
    return {
        f"{prefix}s": sent,
        f"{prefix}_delivered": len(sends),
        f"{prefix}_p50_ms": statistics.median(values) if values else None,
        f"{prefix}_p99_ms": _pct(values, 0.99),
        f"{prefix}_send_p50_ms": statistics.median(sends) if sends else None,
    }


async def drain(url: str, citus: bool, args: argparse.Namespace) -> dict[str, Any]:
    schema = f"akter_cb_{uuid.uuid4().hex[:8]}"
    runtime = await _runtime(url, schema, citus, relay=False, delivery_concurrency=64)
    try:
        async with runtime:
            rids = [f"r-{i:04d}" for i in range(500)]
            for chunk in range(0, len(rids), 32):
                part = rids[chunk : chunk + 32]
                await asyncio.gather(*(runtime.get(Receiver, r).got(0.0) for r in part))
            past = int(time.time() * 1000) - 60_000
            todo = iter(range(args.drain // 100))

            async def stager(i: int) -> None:
                rng = random.Random(i)
                for _ in todo:
                    picks = [rids[rng.randrange(len(rids))] for _ in range(100)]
                    await runtime.get(Sender, f"stager-{i}").stage(picks, past)

            await asyncio.gather(*(stager(i) for i in range(8)))
            before = runtime._relay.delivered
            staged = (args.drain // 100) * 100
            started = time.perf_counter()
            await runtime._loop.start()  # relay=False built the pass loop without starting it
            runtime._relay.wake()
            while runtime._relay.delivered - before < staged:
                if time.perf_counter() - started > 600:
                    break
                await asyncio.sleep(0.005)
            elapsed = time.perf_counter() - started
            delivered = runtime._relay.delivered - before
    finally:
        await _drop(url, schema)
    return {"drained": delivered, "drain_s": elapsed, "claimed_per_s": delivered / elapsed}


async def _spread(url: str, schema: str) -> dict[str, Any]:
    """How many shards and workers the benchmark's actor rows live on (Citus only)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT count(DISTINCT s.shardid), count(DISTINCT (s.nodename, s.nodeport))"
            f' FROM "{schema}".actors a, LATERAL (SELECT shardid, nodename, nodeport'
            "  FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column("
            f"  '\"{schema}\".actors', a.routing_key)) s"
            " WHERE a.actor_type IN ('Counter', 'TenantCounter')"
        )
        row = await cur.fetchone()
    assert row is not None
    return {"shards_used": int(row[0]), "workers_used": int(row[1])}


async def _drop(url: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    citus = await _is_citus(url)
    schema = f"akter_cb_{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {
        "url": url, "citus": citus, "callers": args.callers, "placement": args.placement,
        "emit": args.emit,
    }  # fmt: skip
    runtime = await _runtime(url, schema, citus)
    args.nodes = await _nodes(url, citus)
    try:
        async with runtime:
            out |= await turns(runtime, args)
            cpu = ", ".join(f"{k} {v:.2f}" for k, v in out["cpu_ms_per_turn"].items())
            print(f"{url}: CPU ms per turn: {cpu}", flush=True)
            if citus:
                out |= await _spread(url, schema)
            print(f"{url}: turns {out['turns_per_s']:.0f}/s p50 {out['turn_p50_ms']:.2f} ms "
                  f"p99 {out['turn_p99_ms']:.2f} ms; shards {out.get('shards_used', '-')}, "
                  f"workers {out.get('workers_used', '-')}", flush=True)  # fmt: skip
            out |= await latency(runtime, args)
            print(f"{url}: intent latency p50 {out['intent_p50_ms']:.1f} ms "
                  f"p99 {out['intent_p99_ms']:.1f} ms, from the send p50 "
                  f"{out['intent_send_p50_ms']:.1f} ms "
                  f"({out['intent_delivered']}/{out['intents']}, senders back to back)",
                  flush=True)  # fmt: skip
            if args.rate:
                out |= await latency(runtime, args, args.rate)
                print(f"{url}: intent latency at {args.rate:g}/s p50 {out['paced_p50_ms']:.1f} ms "
                      f"p99 {out['paced_p99_ms']:.1f} ms, from the send p50 "
                      f"{out['paced_send_p50_ms']:.1f} ms "
                      f"({out['paced_delivered']}/{out['paceds']})", flush=True)  # fmt: skip
    finally:
        await _drop(url, schema)
    if args.no_drain:
        return out
    out |= await drain(url, citus, args)
    print(f"{url}: claim rate {out['claimed_per_s']:.0f} intents/s "
          f"({out['drained']} in {out['drain_s']:.1f} s)", flush=True)  # fmt: skip
    return out


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [await measure(url, args) for url in args.url]


#: (key, label, goal as Citus / plain: ("<=", x) or (">=", x), or None)
_ROWS = (
    ("turns_per_s", "turns/s", (">=", 0.5)),
    ("turn_p50_ms", "turn p50 ms", None),
    ("intent_p50_ms", "intent latency p50 ms", ("<=", 3.0)),
    ("intent_p99_ms", "intent latency p99 ms", None),
    ("paced_p50_ms", "… at --rate, p50 ms", ("<=", 3.0)),
    ("paced_p99_ms", "… at --rate, p99 ms", None),
    ("paced_send_p50_ms", "… from the send, p50 ms", None),
    ("claimed_per_s", "claim rate intents/s", None),
)


def table(results: list[dict[str, Any]]) -> str:
    """Plain beside Citus, their ratio and issue 45's goal (the first of each kind)."""
    plain = next((r for r in results if not r["citus"]), None)
    citus = next((r for r in results if r["citus"]), None)
    if plain is None or citus is None:
        return ""
    lines = [
        f"{'measure':<24}{'plain':>10}{'citus':>10}{'citus/plain':>13}  goal",
        "-" * 66,
    ]
    for key, label, goal in _ROWS:
        if key not in plain or key not in citus or not plain[key]:
            continue
        ratio = citus[key] / plain[key]
        verdict = ""
        if goal is not None:
            sign, bound = goal
            met = ratio <= bound if sign == "<=" else ratio >= bound
            verdict = f"{sign} {bound:g}x: {'met' if met else 'NOT met'}"
        lines.append(f"{label:<24}{plain[key]:>10.1f}{citus[key]:>10.1f}{ratio:>12.2f}x  {verdict}")
    if "turns_per_worker_vcpu_s" in citus:
        lines.append(
            f"Citus: {citus['turns_per_worker_vcpu_s']:.0f} turns per worker vCPU-second "
            f"(worker CPU only; plain: {plain.get('turns_per_server_vcpu_s', 0):.0f} turns per "
            "server vCPU-second)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", required=True)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--actors", type=int, default=1000)
    parser.add_argument("--drain", type=int, default=5000)
    parser.add_argument("--placement", choices=("actor", "tenant"), default="actor")
    parser.add_argument("--no-drain", action="store_true", help="skip the claim-rate drain")
    parser.add_argument(
        "--emit", action="store_true", help="each measured turn also emits an event (a row)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="intents/s of the paced latency run (0: skip it); below both servers' claim rate",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    summary = table(results)
    if summary:
        print(summary)
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            for result in results:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
