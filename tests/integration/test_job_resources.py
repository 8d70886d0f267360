"""A job's dependencies: ``Runtime(resources=...)`` and ``call.resource(key)`` on real PostgreSQL.

A resource is set up once per runtime when it starts, reached by executors through their call,
replaced by a test with ``override``, and torn down when the runtime stops; a missing one fails
the attempt as not applied and the job ends as a dead letter naming the resource.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import pytest
from pydantic import BaseModel, Field

import akter
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, hang, succeed
from tests._support import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Gateway:
    """A stand-in client with a life: opened by its setup, closed by its teardown."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.closed = False

    async def __call__(self, call: akter.JobCall, key: str | None = None) -> str:
        assert not self.closed, "a job used a resource after its teardown"
        return f"{self.name}:{call.job_id}"


class Charger(Protocol):
    """What the jobs need of a payment client (a protocol, so a test's fake fits the key)."""

    async def __call__(self, call: akter.JobCall, key: str | None = None) -> Any: ...


GATEWAY = akter.Resource[Charger]("gateway")
AUDIT = akter.Resource[list[str]]("audit")
UNPROVIDED = akter.Resource[Gateway]("ledger")


class Charge(BaseModel):
    cents: int


class Book(BaseModel):
    done: list[Any] = Field(default_factory=list)


class Till(akter.Actor[Book], access=akter.public):
    @akter.command
    async def charge(self, cents: int) -> str:
        return self.enqueue(Till.pay, Charge(cents=cents))

    @akter.command
    async def book(self, cents: int) -> str:
        return self.enqueue(Till.record, Charge(cents=cents))

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5)
    async def pay(call: akter.JobCall, req: Charge) -> str:
        gateway = call.resource(GATEWAY)
        call.resource(AUDIT).append(f"pay {req.cents}")
        result: str = await gateway(call)
        return result

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5)
    async def record(call: akter.JobCall, req: Charge) -> str:
        result: str = await call.resource(UNPROVIDED)(call)
        return result

    @pay.on_success
    async def paid(self, result: str) -> None:
        self.state.done.append(["paid", result])

    @record.on_success
    async def recorded(self, result: str) -> None:
        self.state.done.append(["recorded", result])

    @pay.on_dead_letter
    async def pay_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.done.append(["dead", letter.cause, letter.attempts, letter.ambiguous])

    @record.on_dead_letter
    async def record_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.done.append(["dead", letter.cause, letter.attempts, letter.ambiguous])

    @akter.query
    async def done(self) -> list[Any]:
        return list(self.state.done)


def application_resources(log: list[str]) -> akter.Resources:
    """What the application hands its runtime: a gateway with a life, and a shared list."""
    resources = akter.Resources().provide(AUDIT, [])

    @resources.setup(GATEWAY)
    async def gateway() -> AsyncIterator[Charger]:
        made = Gateway(f"real{len([e for e in log if e.startswith('open')])}", log)
        log.append(f"open {made.name}")
        yield made
        made.closed = True
        log.append(f"close {made.name}")

    return resources


async def settled(t: ActorTest, till: Any, n: int) -> list[Any]:
    async def check() -> bool:
        await t.advance(0.05)
        return len(await till.done()) >= n

    await until(check, within=20, interval=0)
    return [list(entry) for entry in await till.done()]


async def test_a_job_uses_the_resource_its_runtime_set_up_once(akter_test: Make) -> None:
    log: list[str] = []
    resources = application_resources(log)
    async with akter_test([Till], relay=False, resources=resources) as t:
        assert log == ["open real0"]  # set up at start, before any job
        till = t.get(Till, "t1")
        first = await till.charge(100)
        second = await till.charge(200)
        # Two jobs run side by side: their routes arrive in either order.
        assert sorted(await settled(t, till, 2)) == sorted(
            [["paid", f"real0:{first}"], ["paid", f"real0:{second}"]]
        )
        assert log == ["open real0"]  # once per runtime, not per attempt
        assert await t.rows("SELECT intent_id FROM {schema}.outbox") == []
    assert log == ["open real0", "close real0"]  # torn down when the runtime stopped


async def test_a_test_replaces_one_resource_and_keeps_the_others(akter_test: Make) -> None:
    log: list[str] = []
    audit: list[str] = []
    fake = FakeProvider(default=succeed("fake-charge"))
    resources = application_resources(log).override(AUDIT, audit)
    replaced = resources.override(GATEWAY, fake)
    async with akter_test([Till], relay=False, resources=replaced) as t:
        till = t.get(Till, "t1")
        job_id = await till.charge(300)
        assert await settled(t, till, 1) == [["paid", "fake-charge"]]
    assert log == []  # the replaced setup never ran
    assert [(c.job_id, c.attempt) for c in fake.calls] == [(job_id, 1)]
    assert audit == ["pay 300"]  # the other resource is the application's (here overridden too)


async def test_each_runner_sets_up_its_own_and_tears_it_down_at_stop(akter_test: Make) -> None:
    log: list[str] = []
    async with akter_test(
        [Till], relay=False, runners=2, resources=application_resources(log)
    ) as t:
        assert sorted(log) == ["open real0", "open real1"]
        await t.runtimes[1].stop()
        assert log[-1] in ("close real0", "close real1") and len(log) == 3
    assert sorted(log) == ["close real0", "close real1", "open real0", "open real1"]


async def test_teardown_comes_after_the_attempts_a_stop_interrupts(akter_test: Make) -> None:
    provider = FakeProvider()
    step = hang()
    provider.script(step)
    at_teardown: list[str] = []
    resources = akter.Resources().provide(AUDIT, [])

    @resources.setup(GATEWAY)
    async def gateway() -> AsyncIterator[Charger]:
        yield provider
        at_teardown.extend(c.outcome for c in provider.calls)

    async with akter_test([Till], relay=False, resources=resources) as t:
        await t.get(Till, "t1").charge(1)
        assert await t.runtime._jobs.run_pass() == 1  # the attempt starts as a task
        await step.entered.wait()
        assert at_teardown == []
    # The stop interrupted the attempt (its row stays running), then tore the gateway down.
    assert at_teardown == ["interrupted"]


async def test_a_missing_resource_dead_letters_the_job_naming_it(akter_test: Make) -> None:
    log: list[str] = []
    async with akter_test([Till], relay=False, resources=application_resources(log)) as t:
        till = t.get(Till, "t1")
        job_id = await till.book(5)
        (dead,) = await settled(t, till, 1)
        cause = (
            f"MissingResource: Job {job_id!r} of Till 't1' asked for resource 'ledger', which this"
            " runtime does not provide; give the runtime resources= with a provide() or setup()"
            " for it."
        )
        # Not applied (the lookup comes first): retried under attempts=2, then dead-lettered.
        assert dead == ["dead", cause, 2, False]
        (letter,) = await t.rows(
            "SELECT job, attempts, cause, ambiguous FROM {schema}.dead_letters"
        )
        assert letter == {"job": "record", "attempts": 2, "cause": cause, "ambiguous": False}


async def test_a_runtime_without_resources_names_the_missing_one(akter_test: Make) -> None:
    async with akter_test([Till], relay=False) as t:
        till = t.get(Till, "t1")
        await till.charge(1)
        ((_, cause, attempts, ambiguous),) = await settled(t, till, 1)
        assert "asked for resource 'gateway', which this runtime does not provide" in cause
        assert (attempts, ambiguous) == (2, False)


async def test_a_failing_setup_fails_start_and_tears_down_the_earlier_ones(
    akter_db: str,
) -> None:
    log: list[str] = []
    resources = application_resources(log)
    broken = akter.Resource[int]("broken")

    @resources.setup(broken)
    async def fails() -> AsyncIterator[int]:
        raise OSError("no route to the provider")
        yield 0  # pragma: no cover - makes it a generator

    harness = ActorTest([Till], database_url=akter_db, relay=False, resources=resources)
    with pytest.raises(OSError, match="no route to the provider"):
        await harness.__aenter__()
    assert log == ["open real0", "close real0"]
    await harness.__aexit__(None, None, None)


def test_resources_refuse_duplicates_unknown_overrides_and_other_keys() -> None:
    resources = akter.Resources().provide(AUDIT, [])
    with pytest.raises(akter.ConfigurationError, match="already provided; use override"):
        resources.provide(AUDIT, [])
    with pytest.raises(akter.ConfigurationError, match=r"Cannot override akter\.Resource"):
        resources.override(GATEWAY, Gateway("x", []))
    with pytest.raises(akter.ConfigurationError, match=r"keyed by akter\.Resource"):
        resources.provide("audit", [])  # type: ignore[arg-type]
    with pytest.raises(akter.ConfigurationError, match="non-empty name"):
        akter.Resource[int]("")
    assert AUDIT in resources and GATEWAY not in resources
