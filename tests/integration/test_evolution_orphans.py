"""Conformance EVO-10: orphans are never silent (evolution E2), on a real PostgreSQL.

A v1 harness writes rows under names that the v2 code no longer claims (a class renamed without
``name=``, a removed command and job, a renamed event tag without ``aliases=``), then exits
keeping its schema; the v2 harness on the same schema must log one warning per orphan with its
row counts and fix, set the gauge ``akter.orphans`` by kind, keep every row and stay ready. The
comparison reads the deployment's registry of declared names (migration 0005).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest

pytestmark = pytest.mark.timeout(120)

#: How long a test waits for a maintenance cycle it expects (never a sleep for ordering).
EXPECT_WITHIN = 10.0


class Bal(BaseModel):
    cents: int = 0


class Paid(akter.Event, tag="orph.Paid"):
    cents: int


class Settled(akter.Event, tag="orph.Settled"):
    cents: int


class Charge(BaseModel):
    cents: int


# --- v1 ------------------------------------------------------------------------------------


class Wallet(akter.Actor[Bal], access=akter.public):
    @akter.command
    async def put(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents


class AccountV1(akter.Actor[Bal], name="Account", access=akter.public, events=[Paid]):
    @akter.command
    async def pay(self, cents: int) -> None:
        self.state.cents += cents
        self.emit(Paid(cents=cents))
        self.enqueue(AccountV1.charge, Charge(cents=cents), after=3600)

    @akter.command
    async def refund(self, cents: int) -> None:
        self.state.cents -= cents

    @akter.job()
    async def charge(call: akter.JobCall, payload: Charge) -> None:
        return None


class SenderV1(akter.Actor[Bal], name="Sender", access=akter.public):
    @akter.command
    async def go(self) -> None:
        self.send(Wallet.put, "w1", 1)
        self.send(AccountV1.refund, "a", 1)
        self.later(after=3600).send(AccountV1.refund, "a", 2)


# --- v2: Wallet renamed to Purse without name=, refund and charge removed, Paid renamed ------


class Purse(akter.Actor[Bal], access=akter.public):
    @akter.command
    async def put(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents


class AccountV2(akter.Actor[Bal], name="Account", access=akter.public, events=[Settled]):
    @akter.command
    async def pay(self, cents: int) -> None:
        self.state.cents += cents
        self.emit(Settled(cents=cents))


class SenderV2(akter.Actor[Bal], name="Sender", access=akter.public):
    @akter.command
    async def go(self) -> None:
        return None


class Newer(akter.Actor[Bal], access=akter.public):
    @akter.command
    async def put(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents


@asynccontextmanager
async def version(
    url: str, schema: str, actors: Sequence[type[Any]], *, keep: bool, **options: Any
) -> AsyncIterator[ActorTest]:
    async with ActorTest(
        actors, database_url=url, schema=schema, keep_schema=keep, relay=False, **options
    ) as t:
        yield t


async def seed_v1(url: str, schema: str) -> None:
    async with version(url, schema, [Wallet, AccountV1, SenderV1], keep=True) as v1:
        await v1.get(Wallet, "w1").put(5)
        await v1.get(Wallet, "w2").put(5)
        await v1.get(AccountV1, "a").pay(3)
        await v1.get(SenderV1, "s").go()


def orphan_warnings(caplog: pytest.LogCaptureFixture) -> dict[tuple[Any, Any, Any], Any]:
    return {
        (
            getattr(r, "orphan_kind", None),
            getattr(r, "actor_type", None),
            getattr(r, "member", None),
        ): r
        for r in caplog.records
        if r.name == "akter.orphans" and r.levelno == logging.WARNING
    }


async def snapshot(t: ActorTest) -> dict[str, list[dict[str, Any]]]:
    return {
        table: await t.rows(f"SELECT * FROM {{schema}}.{table} ORDER BY 1, 2, 3")
        for table in ("actors", "outbox", "events", "dead_letters", "deployment_names")
    }


async def test_EVO10_orphans_are_logged_with_their_counts_and_fix_at_start(
    akter_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    schema = f"akter_t_{uuid.uuid4().hex[:12]}"
    await seed_v1(akter_db, schema)
    caplog.set_level(logging.WARNING, logger="akter.orphans")
    async with version(
        akter_db, schema, [Purse, AccountV2, SenderV2], keep=False, maintenance=False
    ) as v2:
        warned = orphan_warnings(caplog)
        assert set(warned) == {
            ("actor_type", "Wallet", None),
            ("command", "Account", "refund"),
            ("job", "Account", "charge"),
            ("event", "Account", "orph.Paid"),
        }
        wallet = warned[("actor_type", "Wallet", None)]
        assert wallet.rows == {"actors": 2, "outbox": 1, "dead_letters": 0, "events": 0}
        assert "name='Wallet'" in wallet.fix
        refund = warned[("command", "Account", "refund")]
        assert refund.rows == {"outbox": 2}  # an intent and a timer
        assert "aliases=('refund',)" in refund.fix
        assert warned[("job", "Account", "charge")].rows == {"outbox": 1, "dead_letters": 0}
        assert warned[("event", "Account", "orph.Paid")].rows == {"events": 1}
        assert v2.runtime.readiness == "ready"
        # Without the maintenance lease this runner reports no gauge.
        assert v2.runtime.metrics.gauge("akter.orphans", kind="actor_type") is None

        # A second check within the hour logs nothing again, and the rows are all kept.
        before = await snapshot(v2)
        caplog.clear()
        again = await v2.runtime._runners.orphans.check([], owner=False)
        assert len(again) == 4 and orphan_warnings(caplog) == {}
        assert await snapshot(v2) == before


async def test_EVO10_the_maintenance_owner_sets_the_gauge_by_kind(akter_db: str) -> None:
    schema = f"akter_t_{uuid.uuid4().hex[:12]}"
    await seed_v1(akter_db, schema)
    async with version(akter_db, schema, [Purse, AccountV2, SenderV2], keep=False) as v2:
        orphans = v2.runtime._runners.orphans
        await asyncio.wait_for(orphans.wait_for(2), EXPECT_WITHIN)  # start, first cycle
        metrics = v2.runtime.metrics
        for kind in ("actor_type", "command", "job", "event"):
            assert metrics.gauge("akter.orphans", kind=kind) == 1.0, kind
        assert v2.runtime.readiness == "ready"

        # The fix is a deploy: once the rows are gone, the next cycle counts none and forgets
        # the member names (actor types stay recorded with their placements).
        await v2.rows("DELETE FROM {schema}.outbox WHERE command IN ('refund', 'charge', 'put')")
        await v2.rows("DELETE FROM {schema}.events WHERE tag = 'orph.Paid'")
        await v2.rows("DELETE FROM {schema}.receipts WHERE actor_type = 'Wallet'")
        await v2.rows("DELETE FROM {schema}.actors WHERE actor_type = 'Wallet'")
        await orphans.check([], owner=True)
        for kind in ("actor_type", "command", "job", "event"):
            assert metrics.gauge("akter.orphans", kind=kind) == 0.0, kind
        names = await v2.rows(
            "SELECT actor_type, kind, name FROM {schema}.deployment_names"
            " WHERE actor_type = 'Account' AND kind <> 'state' ORDER BY kind, name"
        )
        assert [(n["kind"], n["name"]) for n in names] == [
            ("command", "pay"),
            ("event", "orph.Settled"),
        ]
        [deployment] = await v2.rows("SELECT placements FROM {schema}.deployment")
        assert "Wallet" in deployment["placements"]


async def test_the_registry_records_names_at_start_as_a_union(akter_db: str) -> None:
    schema = f"akter_t_{uuid.uuid4().hex[:12]}"
    async with version(akter_db, schema, [AccountV1], keep=True, maintenance=False) as v1:
        first = await v1.rows(
            "SELECT actor_type, kind, name, recorded_at_ms FROM {schema}.deployment_names"
            " WHERE kind <> 'state' ORDER BY 1, 2, 3"  # models: test_evolution_rolling.py
        )
        assert [(r["kind"], r["name"]) for r in first] == [
            ("command", "pay"),
            ("command", "refund"),
            ("event", "orph.Paid"),
            ("job", "charge"),
        ]
    async with version(akter_db, schema, [AccountV2], keep=False, maintenance=False) as v2:
        second = await v2.rows(
            "SELECT actor_type, kind, name, recorded_at_ms FROM {schema}.deployment_names"
            " WHERE kind <> 'state' ORDER BY 1, 2, 3"  # models: test_evolution_rolling.py
        )
        # Only added: the names v2 dropped stay, and recorded rows are not rewritten.
        assert [r for r in second if r["name"] != "orph.Settled"] == first
        assert ("event", "orph.Settled") in [(r["kind"], r["name"]) for r in second]


async def test_names_from_a_newer_deployment_are_judged_by_their_rows(
    akter_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A registry row for a name this (older) code lacks: no rows, no orphan; with rows, one."""
    caplog.set_level(logging.WARNING, logger="akter.orphans")
    async with ActorTest([AccountV2], database_url=akter_db, relay=False, maintenance=False) as t:
        await t.rows(
            "INSERT INTO {schema}.deployment_names VALUES"
            " ('Account', 'command', 'future_cmd', 0), ('Account', 'job', 'future_job', 0),"
            " ('Account', 'event', 'orph.Future', 0)"
        )
        orphans = t.runtime._runners.orphans
        assert await orphans.check([], owner=False) == []
        assert orphan_warnings(caplog) == {}
        # A newer runner's type with rows, hosted by that live runner: not an orphan here.
        newer = await t.add_runtime([AccountV2, Newer])
        await newer.get(Newer, "n").put(1)
        live = {str(x) for r in await t.runtime._runners.live() for x in r.actor_types}
        assert "Newer" in live
        assert await orphans.check(live, owner=False) == []
        # Without that runner, the type is an orphan of this code.
        [orphan] = await orphans.check({"Account"}, owner=False)
        assert (orphan.kind, orphan.actor_type) == ("actor_type", "Newer")
        assert orphan.counts["actors"] == 1


async def test_a_type_nobody_hosts_or_declares_stays_ready_with_rows_kept(akter_db: str) -> None:
    schema = f"akter_t_{uuid.uuid4().hex[:12]}"
    await seed_v1(akter_db, schema)
    async with version(akter_db, schema, [AccountV2, SenderV2], keep=False) as v2:
        await asyncio.wait_for(v2.runtime._runners.orphans.wait_for(2), EXPECT_WITHIN)
        # Retention, pruning and the orphan check ran: no Wallet row was touched.
        wallets = await v2.rows(
            "SELECT actor_id, state FROM {schema}.actors WHERE actor_type = 'Wallet'"
            " ORDER BY actor_id"
        )
        assert wallets == [
            {"actor_id": "w1", "state": {"cents": 5}},
            {"actor_id": "w2", "state": {"cents": 5}},
        ]
        assert v2.runtime.readiness == "ready"


async def test_concurrent_starts_of_two_code_versions_record_both_sets_of_names(
    akter_db: str,
) -> None:
    import psycopg

    from akter._engine.orphans import declared_names
    from akter._store.migrate import migrate
    from akter._store.queries import Queries
    from akter.actor import definition_of

    schema = f"akter_t_{uuid.uuid4().hex[:12]}"
    queries = Queries(schema)
    v1 = declared_names([definition_of(AccountV1)])
    v2 = declared_names([definition_of(AccountV2)])
    first = await psycopg.AsyncConnection.connect(akter_db, autocommit=True)
    second = await psycopg.AsyncConnection.connect(akter_db, autocommit=True)
    try:
        window = 86_400_000
        await asyncio.gather(
            migrate(first, queries, retry_window_ms=window, placements={}, names=v1),
            migrate(second, queries, retry_window_ms=window, placements={}, names=v2),
        )
        cur = await first.execute(
            f'SELECT actor_type, kind, name FROM "{schema}".deployment_names ORDER BY 1, 2, 3'
        )
        assert [tuple(r) for r in await cur.fetchall()] == sorted(set(v1) | set(v2))
    finally:
        await first.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await first.close()
        await second.close()
