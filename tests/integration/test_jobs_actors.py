"""Actors and the shared fake provider of the job tests (no tests here).

Every route appends what it received to the actor's state, with the command id it ran under
and its caller, so tests can check each route ran once with command id = job id.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import akter
import akter.jobs
from akter.testing.provider import FakeProvider

#: The provider every executor below calls; reset by the tests' fixture.
PROVIDER = FakeProvider()


class Charge(BaseModel):
    cents: int
    tag: str = "a"


class JobRefused(akter.DeclaredError):
    why: str


class Book(BaseModel):
    reports: list[dict[str, Any]] = Field(default_factory=list)


def _caller(actor: akter.Actor[Book]) -> list[Any]:
    caller = actor.caller
    assert isinstance(caller, akter.System)
    ref = caller.ref
    return [caller.source, ref.type if ref else None, caller.on_behalf_of]


class Shop(akter.Actor[Book], access=akter.public):
    """Enqueues and cancels jobs; its routes record what they got."""

    @akter.command
    async def buy(self, cents: int, tag: str = "a", key: str | None = None) -> str:
        return self.enqueue(Shop.charge, Charge(cents=cents, tag=tag), key=key)

    @akter.command
    async def buy_plain(self, cents: int, tag: str = "a", key: str | None = None) -> str:
        return self.enqueue(Shop.plain, Charge(cents=cents, tag=tag), key=key)

    @akter.command
    async def buy_slow(self, cents: int, tag: str = "a") -> str:
        return self.enqueue(Shop.slow, Charge(cents=cents, tag=tag))

    @akter.command
    async def buy_four(self, cents: int, tag: str = "a") -> str:
        return self.enqueue(Shop.four, Charge(cents=cents, tag=tag))

    @akter.command
    async def buy_and_cancel(self, cents: int, key: str) -> str:
        job_id = self.enqueue(Shop.charge, Charge(cents=cents), key=key)
        self.cancel_job(key)
        return job_id

    @akter.command
    async def cancel(self, key: str) -> None:
        self.cancel_job(key)

    @akter.command(errors=[JobRefused])
    async def cancel_then_fail(self, key: str) -> None:
        self.cancel_job(key)
        raise JobRefused(why="no")

    @akter.query
    async def reports(self) -> list[dict[str, Any]]:
        return self.state.reports

    # --- charge: two attempts, every route ---------------------------------------------------

    @akter.job(attempts=2, backoff=(0.01, 0.04), timeout=5)
    async def charge(call: akter.JobCall, payload: Charge) -> int:
        value: int = await PROVIDER(call, key=payload.tag)
        return value

    @charge.on_success
    async def charged(self, result: int) -> None:
        self.state.reports.append(
            {"route": "success", "id": self.command_id, "value": result, "caller": _caller(self)}
        )

    @charge.on_dead_letter
    async def charge_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )

    @charge.on_cancelled
    async def charge_cancelled(self, report: akter.jobs.Cancelled[Charge, int]) -> None:
        self.state.reports.append(
            {"route": "cancelled", "id": self.command_id, **report.model_dump(mode="json")}
        )

    # --- plain: no on_cancelled ---------------------------------------------------------------

    @akter.job(attempts=2, backoff=(0.01, 0.04), timeout=5)
    async def plain(call: akter.JobCall, payload: Charge) -> int:
        value: int = await PROVIDER(call, key=payload.tag)
        return value

    @plain.on_success
    async def plain_done(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    @plain.on_dead_letter
    async def plain_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )

    # --- slow: short timeout and backoff, four attempts, no routes ----------------------------

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=0.1)
    async def slow(call: akter.JobCall, payload: Charge) -> int:
        value: int = await PROVIDER(call, key=payload.tag)
        return value

    @slow.on_dead_letter
    async def slow_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )

    # --- four: four attempts, success and dead letter routes ----------------------------------

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=5)
    async def four(call: akter.JobCall, payload: Charge) -> int:
        value: int = await PROVIDER(call, key=payload.tag)
        return value

    @four.on_success
    async def four_done(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    @four.on_dead_letter
    async def four_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )


class Hot(akter.Actor[Book], access=akter.public):
    """Capped jobs: ``one`` runs one attempt per actor at a time, ``two`` two."""

    @akter.command
    async def start_one(self, tags: list[str]) -> list[str]:
        return [self.enqueue(Hot.one, Charge(cents=1, tag=t)) for t in tags]

    @akter.command
    async def start_two(self, tags: list[str]) -> list[str]:
        return [self.enqueue(Hot.two, Charge(cents=2, tag=t)) for t in tags]

    @akter.command
    async def cancel(self, key: str) -> None:
        self.cancel_job(key)

    @akter.command
    async def start_one_keyed(self, tag: str, key: str) -> str:
        return self.enqueue(Hot.one, Charge(cents=1, tag=tag), key=key)

    @akter.query
    async def reports(self) -> list[dict[str, Any]]:
        return self.state.reports

    @akter.job(attempts=2, backoff=(0.01, 0.04), timeout=5, per_actor=1)
    async def one(call: akter.JobCall, payload: Charge) -> int:
        value: int = await PROVIDER(call, key=payload.tag)
        return value

    @one.on_success
    async def one_done(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    @one.on_dead_letter
    async def one_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )

    @one.on_cancelled
    async def one_cancelled(self, report: akter.jobs.Cancelled[Charge, int]) -> None:
        self.state.reports.append(
            {"route": "cancelled", "id": self.command_id, **report.model_dump(mode="json")}
        )

    @akter.job(attempts=2, backoff=(0.01, 0.04), timeout=5, per_actor=2)
    async def two(call: akter.JobCall, payload: Charge) -> int:
        value: int = await PROVIDER(call, key=payload.tag)
        return value

    @two.on_success
    async def two_done(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})


class Rejecting(akter.Actor[Book], access=akter.public):
    """A job whose result type is wider than its on_success route accepts."""

    @akter.command
    async def go(self, key: str | None = None) -> str:
        return self.enqueue(Rejecting.measure, Charge(cents=1, tag="r"), key=key)

    @akter.command
    async def cancel(self, key: str) -> None:
        self.cancel_job(key)

    @akter.query
    async def reports(self) -> list[dict[str, Any]]:
        return self.state.reports

    @akter.job(attempts=3, timeout=5)
    async def measure(call: akter.JobCall, payload: Charge) -> float:
        value: float = await PROVIDER(call, key=payload.tag)
        return value

    @measure.on_success  # type: ignore[arg-type]  # narrower than the result on purpose
    async def measured(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    @measure.on_dead_letter
    async def measure_dead(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )

    @measure.on_cancelled
    async def measure_cancelled(self, report: akter.jobs.Cancelled[Charge, float]) -> None:
        self.state.reports.append(
            {"route": "cancelled", "id": self.command_id, **report.model_dump(mode="json")}
        )


ALL = [Shop, Hot, Rejecting]
