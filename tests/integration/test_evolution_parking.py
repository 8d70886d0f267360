"""Conformance EVO-09 and EVO-12 (evolution.md E3): parked rows and the operator verbs.

A row the code cannot deliver — an unknown command or job, a payload that fails validation
after its migrations — is parked: every column kept, ``parked_at_ms`` set, ``last_error``
naming the cause and the field, attempts as before the claim, no dead letter, never claimed,
retried or deleted by the runtime. ``runtime.outbox`` lists, retries and discards them; a
discard writes the operator audit in the same transaction. Refusals leave every row as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._store.gateway.runners import LiveRunner
from akter.errors import ActorError, InjectedCrash
from akter.testing import ActorTest
from tests._support.counting import count_calls

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: A runner is live while its heartbeat is younger than this (``akter._engine.runners``).
LIVE_S = 36

EXECUTED: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def executed() -> Iterator[list[dict[str, Any]]]:
    EXECUTED.clear()
    yield EXECUTED
    EXECUTED.clear()


class Ledger(BaseModel):
    cents: int = 0
    got: list[dict[str, Any]] = []


class Empty(BaseModel):
    n: int = 0


# --- the old receiver and its sender -----------------------------------------------------------


class AccountOld(akter.Actor[Ledger], name="Account", access=akter.public):
    @akter.command
    async def deposit(self, amount: int) -> int:
        self.state.got.append({"deposit": amount})
        return amount

    @akter.command
    async def withdraw(self, amount: int) -> int:
        self.state.got.append({"withdraw": amount})
        return amount


class Payer(akter.Actor[Empty], access=akter.public):
    @akter.command
    async def pay(self, to: str, amount: int) -> None:
        self.send(AccountOld.deposit, to, amount)

    @akter.command
    async def take(self, to: str, amount: int) -> None:
        self.send(AccountOld.withdraw, to, amount)


# --- new receivers: one drops withdraw and adds a required field, one renames withdraw ---------


class AccountStrict(akter.Actor[Ledger], name="Account", access=akter.public):
    @akter.command
    async def deposit(self, amount: int, memo: str) -> int:  # memo: required, no migration
        self.state.got.append({"deposit": amount, "memo": memo})
        return amount


class AccountRenamed(akter.Actor[Ledger], name="Account", access=akter.public):
    @akter.command
    async def deposit(self, amount: int, memo: str = "") -> int:
        self.state.got.append({"deposit": amount, "memo": memo})
        return amount

    @akter.command(aliases=("withdraw",))
    async def take_out(self, amount: int) -> int:
        self.state.got.append({"take_out": amount})
        return amount


# --- jobs -------------------------------------------------------------------------------------


class Charge(BaseModel):
    amount: int


class StrictCharge(BaseModel):
    amount: int
    sku: str


class ShopOld(akter.Actor[Empty], name="Shop", access=akter.public):
    @akter.command
    async def buy(self, amount: int) -> str:
        return self.enqueue(ShopOld.charge, Charge(amount=amount))

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5)
    async def charge(call: akter.JobCall, payload: Charge) -> int:
        EXECUTED.append({"old": payload.amount})
        return payload.amount

    @charge.on_dead_letter
    async def charge_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.n += 1


class ShopStrict(akter.Actor[Empty], name="Shop", access=akter.public):
    @akter.command
    async def buy(self, amount: int) -> str:
        return self.enqueue(ShopStrict.charge, StrictCharge(amount=amount, sku="x"))

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5)
    async def charge(call: akter.JobCall, payload: StrictCharge) -> int:
        EXECUTED.append({"strict": payload.amount})
        return payload.amount

    @charge.on_dead_letter
    async def charge_dead(self, letter: akter.DeadLetter[StrictCharge]) -> None:
        self.state.n += 1


class ShopRenamed(akter.Actor[Empty], name="Shop", access=akter.public):
    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5, aliases=("charge",))
    async def bill(call: akter.JobCall, payload: Charge) -> int:
        EXECUTED.append({"bill": payload.amount})
        return payload.amount


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY scheduled_at_ms, intent_id")


async def everything(t: ActorTest) -> dict[str, list[dict[str, Any]]]:
    """Every durable row that a refusal must leave as it was."""
    found = {}
    for table, order in (
        ("outbox", "intent_id"),
        ("receipts", "command_id"),
        ("dead_letters", "job_id"),
        ("operator_audit", "audit_id"),
        ("actors", "actor_type, actor_id"),
    ):
        found[table] = await t.rows(f"SELECT * FROM {{schema}}.{table} ORDER BY {order}")
    return found


async def got(t: ActorTest, actor_type: str, actor_id: str) -> list[dict[str, Any]]:
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = %(type)s AND actor_id = %(id)s",
        {"type": actor_type, "id": actor_id},
    )
    return list(rows[0]["state"].get("got", [])) if rows else []


async def staged(t: ActorTest, receiver: type[Any], *calls: tuple[str, int]) -> ActorTest:
    """Stage intents with the old code (runtime 0 hosts only the sender), then host ``receiver``."""
    for command, amount in calls:
        await getattr(t.get(Payer, "p"), command)("a1", amount)
    await t.add_runtime([receiver])
    await t.drain()
    return t


# --- EVO-09: parking intents ------------------------------------------------------------------


async def test_EVO09_an_intent_to_an_unknown_command_is_parked_with_its_columns(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([Payer]) as t:
        await t.get(Payer, "p").take("a1", 5)
        [before] = await outbox(t)
        await t.add_runtime([AccountStrict])
        await t.drain()
        [after] = await outbox(t)
        assert after["parked_at_ms"] is not None
        assert "UnknownCommand" in after["last_error"] and "'withdraw'" in after["last_error"]
        assert "aliases=" in after["last_error"]
        changed = {k for k in before if before[k] != after[k]}
        assert changed == {"parked_at_ms", "last_error", "due_at_ms"}, changed
        assert after["attempts"] == 0
        assert await got(t, "Account", "a1") == []
        assert any(
            m.startswith("Outbox row parked: this code cannot deliver it: intent ")
            for m in caplog.messages
        )
        # Parked rows are never claimed again: more passes change nothing.
        await t.advance(60)
        assert await outbox(t) == [after]


async def test_EVO09_an_intent_whose_payload_fails_validation_is_parked_naming_the_field(
    akter_test: Make,
) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3))
        [row] = await outbox(t)
        assert row["parked_at_ms"] is not None and row["attempts"] == 0
        assert "InvalidInput" in row["last_error"] and "'memo'" in row["last_error"]
        assert await t.rows("SELECT * FROM {schema}.receipts WHERE actor_type = 'Account'") == []


async def test_EVO09_parked_rows_are_listed_for_the_operator(akter_test: Make) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3), ("take", 4))
        rows = await t.runtimes[1].outbox.parked()
        assert sorted(r.command for r in rows) == ["deposit", "withdraw"]
        deposit = next(r for r in rows if r.command == "deposit")
        assert isinstance(deposit, akter.ParkedRow)
        assert (deposit.kind, deposit.tenant, deposit.actor_type, deposit.actor_id) == (
            "intent",
            "default",
            "Account",
            "a1",
        )
        assert deposit.payload == {"amount": 3} and "'memo'" in deposit.error
        assert deposit.parked_at.tzinfo is not None
        only = await t.runtime.outbox.parked(command="withdraw")
        assert [r.command for r in only] == ["withdraw"]
        assert await t.runtime.outbox.parked(kind="job") == []
        assert await t.runtime.outbox.parked(actor_type="Payer") == []


async def test_EVO09_retry_after_adding_an_alias_delivers_exactly_once(akter_test: Make) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("take", 4))
        [parked] = await outbox(t)
        await t.kill(1)
        fixed = await t.add_runtime([AccountRenamed])  # the deploy that adds the alias
        await t.drain()
        assert (await outbox(t))[0]["parked_at_ms"] is not None  # still parked: no auto-retry
        assert await fixed.outbox.retry([parked["intent_id"]]) == 1
        await t.drain()
        assert await outbox(t) == []
        assert await got(t, "Account", "a1") == [{"take_out": 4}]
        [receipt] = await t.rows("SELECT * FROM {schema}.receipts WHERE actor_type = 'Account'")
        assert receipt["command_id"] == parked["intent_id"]
        await t.drain()
        assert await got(t, "Account", "a1") == [{"take_out": 4}]


async def test_EVO09_a_retried_row_that_still_cannot_be_delivered_parks_again(
    akter_test: Make,
) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3))
        [first] = await outbox(t)
        assert await t.runtime.outbox.retry() == 1
        await t.drain()
        [again] = await outbox(t)
        assert again["parked_at_ms"] >= first["parked_at_ms"] and again["attempts"] == 0
        assert "'memo'" in again["last_error"]


async def test_EVO09_retry_and_discard_refuse_unknown_ids_and_write_nothing(
    akter_test: Make,
) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3))
        [row] = await outbox(t)
        before = await everything(t)
        with pytest.raises(ActorError) as refused:
            await t.runtime.outbox.retry([row["intent_id"], "nope-1"])
        assert refused.value.reason == "InvalidInput" and "'nope-1'" in refused.value.message
        with pytest.raises(ActorError) as refused:
            await t.runtime.outbox.discard(["nope-2", row["intent_id"]], reason="cleanup")
        assert "'nope-2'" in refused.value.message
        with pytest.raises(ActorError) as refused:
            await t.runtime.outbox.discard([row["intent_id"]], reason=" ")
        assert refused.value.field == "reason"
        assert await everything(t) == before


async def test_EVO09_discard_deletes_and_audits_in_one_transaction(akter_test: Make) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3), ("take", 4))
        rows = await outbox(t)
        with akter.as_caller(akter.User("ops-alice")):
            done = await t.runtime.outbox.discard(None, reason="obsolete after v2", command="take")
        assert done == 0  # the filter names the receiving command: none is called "take"
        with akter.as_caller(akter.User("ops-alice")):
            done = await t.runtime.outbox.discard(
                [r["intent_id"] for r in rows], reason="obsolete after v2"
            )
        assert done == 2
        assert await outbox(t) == []
        audit = await t.rows("SELECT * FROM {schema}.v_operator_audit ORDER BY command")
        assert [(a["command"], a["operator"], a["action"], a["reason"]) for a in audit] == [
            ("deposit", "ops-alice", "discard", "obsolete after v2"),
            ("withdraw", "ops-alice", "discard", "obsolete after v2"),
        ]
        by_id = {r["intent_id"]: r for r in rows}
        for entry in audit:
            kept = entry["row_json"]
            original = by_id[kept["intent_id"]]
            assert kept["payload"] == original["payload"]
            assert kept["last_error"] == original["last_error"]
            assert kept["parked_at_ms"] == original["parked_at_ms"]
            assert (entry["actor_type"], entry["actor_id"]) == ("Account", "a1")


async def test_EVO09_a_crash_before_the_discard_commits_leaves_row_and_no_audit(
    akter_test: Make,
) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3))
        before = await everything(t)
        t.crash_next("before_discard_commit")
        with pytest.raises(InjectedCrash):
            await t.runtime.outbox.discard(None, reason="x")
        assert await everything(t) == before
        assert await t.runtime.outbox.discard(None, reason="x") == 1
        assert len(await t.rows("SELECT * FROM {schema}.operator_audit")) == 1
        assert await outbox(t) == []


async def test_EVO09_a_crash_before_parking_leaves_the_claim_to_expire_then_parks(
    akter_test: Make,
) -> None:
    async with akter_test([Payer]) as t:
        await t.get(Payer, "p").pay("a1", 3)
        receiver = await t.add_runtime([AccountStrict], relay=False)
        t.crash_next("before_park", runtime=1)
        await receiver._relay.run_pass()
        await receiver._relay.wait_idle()
        [claimed] = await outbox(t)
        assert claimed["parked_at_ms"] is None and claimed["attempts"] == 1  # a process death
        await t.advance(120)  # past the claim lease: redelivered, parked this time
        [row] = await outbox(t)
        assert row["parked_at_ms"] is not None
        assert row["attempts"] == 1, "the parking itself counts no attempt"


async def test_EVO09_parked_rows_survive_retention_sweeps(
    akter_test: Make,
) -> None:
    from akter._engine.retention import sweep

    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3))
        before = await outbox(t)
        await t.advance(60 * 60 * 24 * 30)  # far past every retention window
        for runtime in t.live_runtimes:
            await sweep(runtime._services)
        assert await outbox(t) == before


# --- EVO-09: parking jobs ---------------------------------------------------------------------


async def test_EVO09_a_job_whose_payload_fails_validation_is_parked_without_a_dead_letter(
    akter_test: Make,
) -> None:
    async with akter_test([ShopOld], jobs=[]) as t:
        await t.get(ShopOld, "s").buy(5)
        [before] = await outbox(t)
        await t.add_runtime([ShopStrict], jobs=None)
        await t.drain()
        [after] = await outbox(t)
        assert EXECUTED == []
        assert after["parked_at_ms"] is not None
        assert "'sku'" in after["last_error"]
        for column in ("attempts", "ambiguous", "maybe_applied", "running", "payload"):
            assert after[column] == before[column], column
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        [parked] = await t.runtime.outbox.parked(kind="job")
        assert (parked.command, parked.actor_type, parked.actor_id) == ("charge", "Shop", "s")


async def test_EVO09_a_renamed_job_claims_rows_stored_under_its_alias(akter_test: Make) -> None:
    async with akter_test([ShopOld], jobs=[]) as t:
        await t.get(ShopOld, "s").buy(6)
        await t.add_runtime([ShopRenamed], jobs=None)
        await t.drain()
        assert EXECUTED == [{"bill": 6}]
        assert await outbox(t) == []


# --- EVO-12: dead-letter retry re-validates ---------------------------------------------------


async def test_EVO12_dead_letter_retry_refuses_a_payload_that_no_longer_validates(
    akter_test: Make,
) -> None:
    async with akter_test([ShopOld], jobs=[]) as t:
        await t.get(ShopOld, "s").buy(5)
        [job] = await outbox(t)
        # The letter as the old code left it (its attempts ran out before the deploy).
        await t.rows(
            "INSERT INTO {schema}.dead_letters (routing_key, job_id, tenant_id, actor_type,"
            " actor_id, job, payload, payload_version, attempts, cause, ambiguous, dead_at_ms)"
            " SELECT routing_key, intent_id, tenant_id, actor_type, actor_id, command, payload,"
            " payload_version, 2, 'boom', false, 0 FROM {schema}.outbox"
        )
        await t.rows("DELETE FROM {schema}.outbox")
        strict = await t.add_runtime([ShopStrict], jobs=None)
        before = await everything(t)
        with pytest.raises(ActorError) as refused:
            await strict.dead_letters.retry(job["intent_id"])
        assert refused.value.reason == "InvalidInput"
        assert refused.value.field == "sku" and "'sku'" in refused.value.message
        assert await everything(t) == before
        # Under code whose job accepts it (by an alias), the retry goes through.
        # (jobs=[]: this runtime executes nothing, so the requeued row stays to be read.)
        renamed = await t.add_runtime([ShopRenamed], jobs=[])
        new_id = await renamed.dead_letters.retry(job["intent_id"])
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        [row] = await outbox(t)
        assert row["intent_id"] == new_id and row["command"] == "charge"


# --- jobs no live runner serves: parked when undeclared, counted when declared ----------------


class ShopWithoutCharge(akter.Actor[Empty], name="Shop", access=akter.public):
    @akter.command
    async def ping(self) -> int:
        return 1


async def test_EVO09_an_undeclared_job_no_runner_executes_is_parked_by_the_maintenance_owner(
    akter_test: Make,
) -> None:
    async with akter_test([ShopOld], jobs=[]) as t:
        await t.get(ShopOld, "s").buy(5)
        [before] = await outbox(t)
        await t.kill(0)
        new = await t.add_runtime([ShopWithoutCharge], jobs=None)
        await t.advance(LIVE_S)  # the killed runner, whose code declared the job, is not live
        await new._runners.sampler.sample()
        [after] = await outbox(t)
        assert after["parked_at_ms"] is not None
        assert "UnknownJob" in after["last_error"] and "'charge'" in after["last_error"]
        changed = {k for k in before if before[k] != after[k]}
        assert changed == {"parked_at_ms", "last_error"}, changed
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        await new._runners.sampler.sample()
        assert new.metrics.gauge("akter.outbox.parked", kind="job") == 1
        assert new.metrics.gauge("akter.outbox.parked", kind="intent") == 0


async def test_EVO09_a_job_only_a_live_runners_code_declares_is_left_due_not_parked(
    akter_test: Make,
) -> None:
    """A rolling deploy: the older code lacks the job, the newer code declares it.

    The newer code's runner executes no jobs itself (a web role); the older maintenance owner
    leaves the job's rows due for the newer workers.
    """
    async with akter_test([ShopOld], jobs=[]) as t:  # declares charge, executes nothing
        await t.get(ShopOld, "s").buy(5)
        [before] = await outbox(t)
        older = await t.add_runtime([ShopWithoutCharge], jobs=None)
        await older._runners.sampler.sample()
        assert await outbox(t) == [before]
        assert older.metrics.gauge("akter.jobs.unserved", actor_type="Shop", job="charge") == 1
        # Once no live runner declares it, the same sweep parks the rows.
        await t.kill(0)
        await t.advance(LIVE_S)
        await older._runners.sampler.sample()
        [after] = await outbox(t)
        assert after["parked_at_ms"] is not None


async def test_EVO09_a_declared_job_no_live_runner_executes_is_reported_not_parked(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([ShopOld], jobs=[]) as t:  # declares charge, executes nothing
        await t.get(ShopOld, "s").buy(5)
        [before] = await outbox(t)
        await t.runtime._runners.sampler.sample()
        assert await outbox(t) == [before]
        assert t.runtime.metrics.gauge("akter.jobs.unserved", actor_type="Shop", job="charge") == 1
        assert any(
            m.startswith("Due job rows that no live runner executes: job charge of Shop (1 due)")
            for m in caplog.messages
        )


async def test_EVO09_the_live_runners_are_read_only_while_a_job_row_is_due(
    akter_test: Make,
) -> None:
    # maintenance=False: only this test's samples run (the owner's own loop would count too).
    async with akter_test([ShopOld], jobs=[], maintenance=False) as t:  # executes nothing
        sampler = t.runtime._runners.sampler
        reads = count_calls(sampler, ["_live"])

        def unserved() -> float | None:
            return t.runtime.metrics.gauge("akter.jobs.unserved", actor_type="Shop", job="charge")

        await sampler.sample()
        assert reads["_live"] == 0  # nothing due: nothing can be unserved (an idle owner)
        assert unserved() in (None, 0)

        await t.get(ShopOld, "s").buy(5)
        await sampler.sample()
        assert reads["_live"] == 1
        assert unserved() == 1

        # A live runner that executes it: the same due row is served, so not reported.
        live = sampler._live
        assert live is not None

        other = LiveRunner("other", 0, 0, None, [], ["Shop.charge"], "", draining=False)

        async def serving() -> list[LiveRunner]:
            return [*await live(), other]

        sampler._live = serving
        await sampler.sample()
        assert unserved() in (None, 0)
        assert [row["parked_at_ms"] for row in await outbox(t)] == [None]


# --- crashes around the new durable transitions ------------------------------------------------


async def test_EVO09_a_crash_before_the_retry_commits_leaves_the_row_parked(
    akter_test: Make,
) -> None:
    async with akter_test([Payer]) as t:
        await staged(t, AccountStrict, ("pay", 3))
        before = await everything(t)
        t.crash_next("before_retry_commit")
        with pytest.raises(InjectedCrash):
            await t.runtime.outbox.retry()
        assert await everything(t) == before
        assert await t.runtime.outbox.retry() == 1
        [row] = await outbox(t)
        assert row["parked_at_ms"] is None


async def test_EVO09_a_crash_before_a_job_parks_leaves_the_claim_to_expire_then_parks(
    akter_test: Make,
) -> None:
    async with akter_test([ShopOld], jobs=[]) as t:
        await t.get(ShopOld, "s").buy(5)
        strict = await t.add_runtime([ShopStrict], jobs=None, relay=False)
        t.crash_next("before_park", runtime=1)
        await strict._jobs.run_pass()
        await strict._jobs.wait_idle()
        [claimed] = await outbox(t)
        assert claimed["parked_at_ms"] is None and claimed["attempts"] == 1  # a process death
        await t.advance(120)  # past the job lease: claimed again, parked this time
        [row] = await outbox(t)
        assert row["parked_at_ms"] is not None and row["attempts"] == 1
        assert EXECUTED == []
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []


class ShopCappedOld(akter.Actor[Empty], name="Capped", access=akter.public):
    @akter.command
    async def buy(self, amount: int) -> str:
        return self.enqueue(ShopCappedOld.charge, Charge(amount=amount))

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5, per_actor=1)
    async def charge(call: akter.JobCall, payload: Charge) -> int:
        EXECUTED.append({"old": payload.amount})
        return payload.amount


class ShopCappedStrict(akter.Actor[Empty], name="Capped", access=akter.public):
    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5, per_actor=1)
    async def charge(call: akter.JobCall, payload: StrictCharge) -> int:
        EXECUTED.append({"strict": payload.amount})
        return payload.amount


async def test_EVO09_capped_job_rows_that_fail_validation_are_parked_one_by_one(
    akter_test: Make,
) -> None:
    async with akter_test([ShopCappedOld], jobs=[]) as t:
        await t.get(ShopCappedOld, "s").buy(1)
        await t.get(ShopCappedOld, "s").buy(2)
        before = {r["intent_id"]: r for r in await outbox(t)}
        await t.add_runtime([ShopCappedStrict], jobs=None)
        await t.advance(5)  # the group's second row waits for the first one's end
        after = await outbox(t)
        assert EXECUTED == []
        assert [r["parked_at_ms"] is not None for r in after] == [True, True]
        for row in after:
            assert row["attempts"] == before[row["intent_id"]]["attempts"] == 0
            assert "'sku'" in row["last_error"]
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
