"""On Citus a turn's writes stay on one worker connection: it commits without two-phase commit.

A turn is one single-shard transaction (docs/citus.md). Citus keeps it on one connection to the
actor's worker only while every statement is routed there; an ``INSERT ... SELECT`` from
``unnest`` is planned as "pull to coordinator", which writes the rows with COPY over another
connection, and the commit then takes two-phase commit (a ``pg_dist_transaction`` record, a
``PREPARE`` and a ``COMMIT PREPARED`` on the worker). These turns emit an event, send an intent,
enqueue a job, start a workflow, answer without a state change (a receipt alone) and move a
routed subscription's feed, and each must commit in one phase with its rows written as on plain
PostgreSQL.

Runs in the Citus pass only (``make test-citus``); Citus's prepared-transaction names carry the
coordinator backend's pid (``citus_<group>_<pid>_<n>_<conn>``), so the count is this runtime's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest
from pydantic import BaseModel

import akter
from akter._engine import runners
from akter.testing import ActorTest
from tests._support.barriers import until_pending
from tests._support.citus import ON_CITUS
from tests.integration.subscription_actors import Order, Warehouse

Make = Callable[..., ActorTest]


@pytest.fixture(autouse=True)
def no_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat writes the runners' reference table (two-phase): none during these turns.

    (Maintenance is off too: its sweeps read and write across shards, two-phase as well.)
    """
    monkeypatch.setattr(runners, "HEARTBEAT_MS", 3_600_000)


pytestmark = [
    pytest.mark.skipif(not ON_CITUS, reason="two-phase commit is Citus's: the Citus pass only"),
    pytest.mark.timeout(120),
]


class Ticked(akter.Event, tag="one-phase.Ticked"):
    n: int


class Tally(BaseModel):
    n: int = 0


class Work(BaseModel):
    n: int


class Sink(akter.Actor[Tally], placement="actor"):
    @akter.command
    async def got(self, n: int) -> None:
        self.state.n += n


class Desk(akter.Actor[Tally], placement="actor"):
    @akter.command
    async def tick(self, n: int) -> None:
        self.state.n += n
        self.emit(Ticked(n=n))
        self.emit(Ticked(n=n + 1))

    @akter.command
    async def forward(self, n: int) -> None:
        self.state.n += n
        self.send(Sink.got, "s-1", n)
        self.later(after=3600).send(Sink.got, "s-2", n + 1)

    @akter.command
    async def work(self, n: int) -> list[str]:
        self.state.n += n
        return [self.enqueue(Desk.crunch, Work(n=n)), self.enqueue(Desk.crunch, Work(n=n + 1))]

    @akter.command
    async def read_only(self) -> int:
        return self.state.n

    @akter.command
    async def begin(self, n: int) -> str:
        self.state.n += n
        return self.start_workflow(Desk.flow, n)

    @akter.command
    async def work_capped(self, n: int) -> list[str]:
        self.send(Sink.got, "s-3", n)
        return [self.enqueue(Desk.queue, Work(n=n)), self.enqueue(Desk.queue, Work(n=n + 1))]

    @akter.job(attempts=1)
    async def crunch(call: akter.JobCall, payload: Work) -> int:
        return payload.n

    @akter.job(attempts=1, per_actor=1)
    async def queue(call: akter.JobCall, payload: Work) -> int:
        return payload.n

    @akter.workflow(timeout=timedelta(days=1))
    async def flow(wf: akter.Workflow, n: int) -> int:
        await wf.sleep(timedelta(hours=1))
        return n


async def two_phase_commits(t: ActorTest) -> int:
    """The two-phase commits the coordinator recorded for this runtime's connections."""
    rows = await t.rows(
        "SELECT count(*) AS n FROM pg_dist_transaction d"
        " JOIN pg_stat_activity a ON split_part(d.gid, '_', 3) = a.pid::text"
        " WHERE a.application_name = %(tag)s",
        {"tag": t._tags[t.runtime]},
    )
    return int(rows[0]["n"])


async def test_a_turn_that_emits_sends_enqueues_or_starts_a_run_commits_in_one_phase(
    akter_test: Make,
) -> None:
    async with akter_test([Desk, Sink], relay=False, maintenance=False) as t:
        desk = t.get(Desk, "d-1")
        await desk.tick(1)  # warms the actor: the turns below are warm, as under load
        seen = await two_phase_commits(t)  # the runner's start writes reference tables: 2PC

        async def one_phase(what: str) -> None:
            assert (await two_phase_commits(t), what) == (seen, what)

        await desk.tick(2)
        await one_phase("events")
        await desk.forward(3)
        await one_phase("an intent and a timer")
        job_ids = await desk.work(4)
        await one_phase("two jobs")
        assert await desk.read_only() == 10
        await one_phase("a receipt alone")
        run_id = await desk.begin(5)
        await one_phase("a workflow start")

        # What they wrote is what the plain statements write.
        events = await t.rows(
            "SELECT seq, tag, payload FROM {schema}.events WHERE actor_id = 'd-1' ORDER BY seq"
        )
        assert [(e["seq"], e["payload"]["n"]) for e in events] == [(1, 1), (2, 2), (3, 2), (4, 3)]
        rows = await t.rows(
            "SELECT intent_id, kind, target_id, due_at_ms - scheduled_at_ms AS lag,"
            " ready_at_ms IS NOT NULL AS ready, rank_ms IS NOT NULL AS ranked"
            " FROM {schema}.outbox WHERE actor_id = 'd-1' ORDER BY kind, target_id NULLS LAST"
        )
        intents = [r for r in rows if r["kind"] == "intent"]
        assert [r["target_id"] for r in intents] == ["s-1", "s-2"]
        jobs = [r for r in rows if r["kind"] == "job"]
        assert sorted(r["intent_id"] for r in jobs) == sorted(job_ids)
        assert all(r["ready"] and r["ranked"] and r["lag"] == 0 for r in jobs)
        later = await t.rows(
            "SELECT (o.due_at_ms - a.updated_at_ms) / 60000 AS minutes FROM {schema}.outbox o"
            " JOIN {schema}.actors a ON a.routing_key = o.routing_key AND a.actor_id = 'd-1'"
            " WHERE o.target_id = 's-2'"
        )
        assert [r["minutes"] for r in later] in ([59], [60])
        runs = await t.rows("SELECT run_id, status FROM {schema}.workflows")
        assert runs == [{"run_id": run_id, "status": "runnable"}]
        receipts = await t.rows(
            "SELECT count(*) AS n FROM {schema}.receipts WHERE actor_id = 'd-1'"
        )
        assert receipts == [{"n": 6}]


async def test_a_batch_of_several_commands_commits_in_one_phase(akter_test: Make) -> None:
    """Several commands' events, intents and receipts in one turn (a batch)."""
    async with akter_test([Desk, Sink], relay=False, maintenance=False) as t:
        desk = t.get(Desk, "d-2")
        await desk.tick(1)
        seen = await two_phase_commits(t)  # the runner's start wrote reference tables
        gate = t.pause_next("before_commit")
        head = asyncio.create_task(desk.tick(2))
        await gate.wait()  # held: the next three queue behind it and run as one batch
        tasks = [asyncio.create_task(desk.forward(n)) for n in (3, 4, 5)]
        await until_pending(t.runtime, 4)
        batch = t.pause_next("before_commit")
        gate.release()
        await head
        assert len((await batch.wait())["batch"]) == 3
        batch.release()
        await asyncio.gather(*tasks)
        assert await two_phase_commits(t) == seen
        outbox = await t.rows("SELECT count(*) AS n FROM {schema}.outbox WHERE actor_id = 'd-2'")
        assert outbox == [{"n": 6}]
        events = await t.rows("SELECT count(*) AS n FROM {schema}.events WHERE actor_id = 'd-2'")
        assert events == [{"n": 4}]


async def test_a_source_of_a_routed_subscription_commits_in_one_phase(akter_test: Make) -> None:
    """The source's turn upserts its routed feed in its own shard (sub_feeds_bump_routed)."""
    async with akter_test([Order, Warehouse], relay=False, maintenance=False) as t:
        order = t.get(Order, "o-1")
        await order.pay("w-1")  # warms it and creates the feed
        seen = await two_phase_commits(t)
        await order.pay("w-1", k=2)  # moves the feed's head
        assert await two_phase_commits(t) == seen
        feeds = await t.rows("SELECT head, done FROM {schema}.subscription_feeds")
        assert feeds == [{"head": 3, "done": 0}]


async def test_a_turn_mixing_an_intent_and_capped_jobs_writes_every_row(akter_test: Make) -> None:
    """Capped jobs keep insert_outbox beside the intent's routed insert (the exception).

    Their ready times read the actor's other rows of the job; such a turn commits two-phase.
    """
    async with akter_test([Desk, Sink], relay=False, maintenance=False) as t:
        desk = t.get(Desk, "d-3")
        first = await desk.work_capped(1)
        second = await desk.work_capped(3)
        rows = await t.rows(
            "SELECT intent_id, kind, ready_at_ms FROM {schema}.outbox WHERE actor_id = 'd-3'"
            " ORDER BY kind, ready_at_ms"
        )
        assert [r["kind"] for r in rows] == ["intent", "intent", "job", "job", "job", "job"]
        jobs = [r for r in rows if r["kind"] == "job"]
        # Enqueue order within the actor's capped job: strictly increasing ready times.
        assert [r["intent_id"] for r in jobs] == [*first, *second]
        readies = [r["ready_at_ms"] for r in jobs]
        assert readies == sorted(set(readies))
