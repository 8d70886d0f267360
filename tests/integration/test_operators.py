"""The operator door: ``runtime.operators`` and the test kit's reads, against real PostgreSQL.

Each operator method the surfaces use (the CLI, the HTTP routes, the console, the test kit) is
called here directly and checked against the durable rows it reads or writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest
from pydantic import BaseModel

import akter
from akter.actor import AccessKind
from akter.callers import ActorRef, User
from akter.errors import ActorError, ConfigurationError
from akter.operators import Operators
from akter.operators.workflows import RunLocation
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Item(BaseModel):
    tag: str


class Shipped(BaseModel):
    tracking: str


class Tally(BaseModel):
    n: int = 0


def _owner_only(caller: akter.Caller, ref: ActorRef, member: str, kind: AccessKind) -> bool:
    return isinstance(caller, User) and caller.subject == ref.id


class Shop(akter.Actor[Tally], access=akter.public):
    """Enqueues a job, counts, and runs a workflow that waits for a signal."""

    @akter.command
    async def add(self, n: int) -> int:
        self.state.n += n
        return self.state.n

    @akter.command
    async def enqueue_later(self, tag: str) -> str:
        return self.enqueue(Shop.work, Item(tag=tag), after=3600)

    @akter.job(attempts=1)
    async def work(call: akter.JobCall, item: Item) -> None:
        return None

    @akter.workflow
    async def shipping(wf: akter.Workflow) -> str:
        shipped = await wf.wait(Shipped)
        assert shipped is not None
        return shipped.tracking


class Private(akter.Actor[Tally], access=_owner_only):
    """Only the user named like the actor may touch it."""

    @akter.command
    async def add(self, n: int) -> int:
        self.state.n += n
        return self.state.n


async def test_the_operators_are_one_object_per_runtime_with_the_runtime_s_own_views(
    akter_test: Make,
) -> None:
    async with akter_test([Shop]) as t:
        ops = t.runtime.operators
        assert isinstance(ops, Operators)
        assert t.runtime.operators is ops
        assert ops.dead_letters is t.runtime.dead_letters
        assert ops.outbox is t.runtime.outbox
        assert ops.workflows is t.runtime.workflows


async def test_jobs_overview_recent_and_cancel_read_and_write_the_job_row(
    akter_test: Make,
) -> None:
    async with akter_test([Shop], relay=False) as t:
        job_id = await t.get(Shop, "s").enqueue_later("x")
        jobs = t.runtime.operators.jobs
        listed = await asyncio.to_thread(jobs.overview, t.database_url, 10)
        assert [(r["job_id"], r["job"], r["status"]) for r in listed] == [
            (job_id, "work", "pending")
        ]
        recent = await jobs.recent(10, 5_000)
        assert [(r["job_id"], r["status"]) for r in recent] == [(job_id, "pending")]
        assert await jobs.cancel("no-such-job") == "unknown"
        assert await jobs.cancel(job_id) == "deleted"  # it never ran
        assert await t.sql("SELECT 1 FROM {schema}.outbox WHERE intent_id = %s", [job_id]) == []
        assert await jobs.cancel(job_id) == "unknown"


async def test_jobs_cancel_refuses_a_runtime_that_is_not_started(akter_db: str) -> None:
    runtime = akter.Runtime([Shop], database_url=akter_db, schema="akter_never_started")
    with pytest.raises(ConfigurationError):
        await runtime.operators.jobs.cancel("any")
    with pytest.raises(ConfigurationError):
        runtime.require_started()
    assert not runtime.running


async def test_jobs_progress_checks_access_then_subscribes(akter_test: Make) -> None:
    async with akter_test([Shop, Private]) as t:
        job_id = await t.get(Shop, "s").enqueue_later("x")
        stream = await t.runtime.operators.jobs.progress(t.runtime.ref(Shop, "s"), job_id)
        await stream.aclose()
        with akter.as_caller(User("mallory")), pytest.raises(ActorError) as refused:
            await t.runtime.operators.jobs.progress(t.runtime.ref(Private, "alice"), job_id)
        assert refused.value.code == "access_denied"


async def test_actors_reads_show_the_committed_row_its_events_and_outbox(
    akter_test: Make,
) -> None:
    async with akter_test([Shop], relay=False) as t:
        shop = t.get(Shop, "s")
        await shop.add(2)
        job_id = await shop.enqueue_later("x")
        ref = t.runtime.ref(Shop, "s")
        never = t.runtime.ref(Shop, "never")
        actors = t.runtime.operators.actors

        inspected = await asyncio.to_thread(actors.inspect, t.database_url, ref)
        assert inspected.actor is not None and inspected.actor["state"] == {"n": 2}
        assert len(inspected.receipts) == 2
        assert [o["intent_id"] for o in inspected.outbox] == [job_id]
        history = await actors.history(t.database_url, ref)
        assert history.actor == inspected.actor  # the same row, read the same way
        assert history.receipts == inspected.receipts
        assert [o["intent_id"] for o in history.outbox] == [job_id]
        assert (await actors.history(t.database_url, never)).actor is None

        assert await actors.states([ref, never]) == [{"n": 2}, None]
        types = await actors.types(100, 5_000)
        assert [(r["actor_type"], r["actors"]) for r in types] == [("Shop", 1)]
        totals = await actors.totals(100, 5_000)
        assert totals["jobs"] == 1
        page = await actors.page("Shop", None, ("", ""), 10, 5_000)
        assert [(r["tenant_id"], r["actor_id"]) for r in page] == [("default", "s")]
        row = await actors.row(ref, 5_000)
        assert row is not None and row["state"] == {"n": 2} and row["receipts"] == 2
        assert await actors.row(never, 5_000) is None
        assert await actors.recent_events(ref, 10, 5_000) == []
        assert [o["intent_id"] for o in await actors.outbox(ref, 5_000)] == [job_id]


async def test_outbox_overviews_list_the_pending_rows(akter_test: Make) -> None:
    async with akter_test([Shop], relay=False) as t:
        job_id = await t.get(Shop, "s").enqueue_later("x")
        outbox = t.runtime.operators.outbox
        rows = await asyncio.to_thread(outbox.overview, t.database_url, 10)
        assert [r["intent_id"] for r in rows] == [job_id]
        # The console's list shows intents, timers and ticks: a job row is not among them.
        assert await outbox.pending(10, 5_000) == []


async def test_database_knows_the_migrations_applied_and_the_placements(
    akter_test: Make,
) -> None:
    async with akter_test([Shop]) as t:
        database = t.runtime.operators.database
        known = database.known_migrations()
        assert known == sorted(known) and known[0].startswith("0001")
        assert await database.applied_migrations(t.database_url) == set(known)
        assert await database.is_citus(t.database_url) is t.on_citus
        assert database.placements == {"Shop": "tenant"}
        assert database.all_tenant_placed
        quoted = database.substitute("SELECT 1 FROM {schema}.outbox")
        assert quoted == f'SELECT 1 FROM "{t.schema}".outbox'


async def test_database_reads_no_migration_of_a_missing_schema(akter_db: str) -> None:
    runtime = akter.Runtime([Shop], database_url=akter_db, schema="akter_missing_schema")
    assert await runtime.operators.database.applied_migrations(akter_db) == set()


async def test_workflows_locate_and_journal_a_run_by_its_id(akter_test: Make) -> None:
    async with akter_test([Shop]) as t:
        run = await t.get(Shop, "s").shipping.start()
        await t.drain()
        workflows = t.runtime.operators.workflows
        assert await workflows.locate("no-such-run") is None
        found = await workflows.locate(run.id)
        assert found is not None
        assert found == RunLocation(run.id, t.runtime.ref(Shop, "s"), "shipping", found.routing_key)
        assert found.routing_key == t.runtime.routing_key(found.actor)
        waiting = await workflows.journal(found)
        assert waiting is not None and waiting.status == "suspended"
        assert [s.kind for s in waiting.steps] == ["wait"]
        await run.signal(Shipped(tracking="T1"))
        await t.drain()
        ended = await workflows.journal(found, waiting.steps[-1].seq)
        assert ended is not None and ended.status == "completed" and ended.result == "T1"
        assert all(s.seq > waiting.steps[-1].seq for s in ended.steps)


async def test_check_access_asks_the_type_s_policy(akter_test: Make) -> None:
    async with akter_test([Private]) as t:
        ref = t.runtime.ref(Private, "alice")
        await t.runtime.check_access(ref, User("alice"), "command", "add")
        with pytest.raises(ActorError) as refused:
            await t.runtime.check_access(ref, User("mallory"), "command", "add")
        assert refused.value.reason == "Unauthorized"
        assert refused.value.code == "access_denied"


async def test_runtime_names_its_runner_and_whether_it_runs(akter_test: Make) -> None:
    async with akter_test([Shop]) as t:
        assert t.runtime.running
        t.runtime.require_started()
        [row] = await t.sql("SELECT runner_id::text AS id FROM {schema}.runners")
        assert row["id"] == t.runtime.runner_id
    assert not t.runtime.running


async def test_the_test_kit_s_sql_reads_and_refuses_writes(akter_test: Make) -> None:
    async with akter_test([Shop]) as t:
        await t.get(Shop, "s").add(3)
        rows = await t.sql(
            "SELECT actor_id, state FROM {schema}.actors WHERE actor_type = %(type)s",
            {"type": "Shop"},
        )
        assert rows == [{"actor_id": "s", "state": {"n": 3}}]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await t.sql("DELETE FROM {schema}.actors")
        assert len(await t.sql("SELECT 1 FROM {schema}.actors")) == 1


async def test_the_test_kit_waits_for_the_job_attempts_of_a_runner(akter_test: Make) -> None:
    async with akter_test([Shop], relay=False) as t:
        await t.get(Shop, "s").enqueue_later("x")
        await t.rows("UPDATE {schema}.outbox SET due_at_ms = 0 WHERE kind = 'job'")
        started = await t.runtime._jobs.run_pass()
        assert started == 1
        await t.wait_idle()
        assert t.runtime._jobs.running == 0
        assert await t.sql("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'") == []


async def test_the_clock_estimate_is_a_lower_bound_of_the_framework_clock(
    akter_test: Make, akter_db: str
) -> None:
    unstarted = akter.Runtime([Shop], database_url=akter_db, schema="akter_never_started")
    with pytest.raises(RuntimeError):
        unstarted.clock_estimate_ms()
    async with akter_test([Shop]) as t:
        estimate = t.runtime.clock_estimate_ms()
        assert estimate <= await t.now_ms()
