"""A job attempt's settle decisions, without a database (semantics §5.9).

``rules.report`` is how an attempt ended, ``rules.classify_value`` what a returned value means
for its routes, ``rules.decide`` the settle plan of an attempt, and ``after_record``,
``cancelled_end``, ``after_lost_letter`` and ``late`` what each guarded write's answer leads
to. The combinations are enumerated: every input of the boolean rules is tried.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._engine.jobs import rules
from akter._engine.jobs.claims import ClaimedJob
from akter._engine.jobs.routes import Route
from akter._engine.jobs.rules import (
    Abandoned,
    Deliver,
    Drop,
    EndCancelled,
    Exhaust,
    Failed,
    Failure,
    Interrupted,
    Recorded,
    RecordFailure,
    Rejected,
    Report,
    Retry,
    Stale,
    Stop,
    Succeeded,
    Unattempted,
)
from akter._kinds import WorkflowCommand
from akter.callers import System, caller_to_json

SUCCESS = Route("charged", '{"result":1}')
CANCELLED = Route("charge_cancelled", '{"report":{}}')
FAILURE = Failure("RuntimeError: boom", ambiguous=True)


class Charge(BaseModel):
    cents: int


class State(BaseModel):
    seen: list[Any] = []


class Shop(akter.Actor[State], name="JobRulesShop"):
    @akter.job(attempts=3, backoff=(1.0, 4.0))
    async def charge(call: akter.JobCall, payload: Charge) -> float:
        return 1.0

    @charge.on_success  # type: ignore[arg-type]  # narrower than the result on purpose
    async def charged(self, result: int) -> None:
        self.state.seen.append(result)

    @charge.on_cancelled
    async def charge_cancelled(self, report: akter.Cancelled[Charge, int]) -> None:
        self.state.seen.append(report)


class Plain(akter.Actor[State], name="JobRulesPlain"):
    @akter.job(attempts=2)
    async def ping(call: akter.JobCall, payload: Charge) -> int:
        return 1


def claim(
    attempts: int = 1,
    *,
    cancelled: bool = False,
    exhausted: bool = False,
    ambiguous: bool = False,
    maybe_applied: bool = False,
    last_error: str | None = None,
    caller: str = "{}",
) -> ClaimedJob:
    return ClaimedJob(
        routing_key=1,
        intent_id="job-1",
        tenant_id="t",
        actor_type="JobRulesShop",
        actor_id="s1",
        command="charge",
        payload='{"cents":5}',
        payload_version=0,
        caller=caller,
        attempts=attempts,
        last_error=last_error,
        ambiguous=ambiguous,
        maybe_applied=maybe_applied,
        claimed_until=0,
        cancelled=cancelled,
        exhausted=exhausted,
        sent_at=0.0,
    )


# --- how an attempt ended ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "executed",
    [Succeeded(SUCCESS, None), Failed(FAILURE), Rejected(FAILURE, CANCELLED)],
)
@pytest.mark.parametrize("stop", ["lost", "cancelled", "deadline", "stopped"])
def test_an_executor_that_returned_reports_its_exit_whatever_else_stopped(
    executed: rules.Reported, stop: Stop
) -> None:
    assert rules.report(executed, stop) is executed


@pytest.mark.parametrize(
    ("stop", "ended"),
    [
        ("cancelled", Interrupted()),
        ("lost", Abandoned("Job attempt lost its lease")),
        ("deadline", Abandoned("Job attempt outlived its lease; interrupted")),
        ("stopped", Abandoned(None)),
    ],
)
def test_an_interrupted_attempt_settles_only_for_its_cancellation(
    stop: Stop, ended: rules.Reported | Abandoned
) -> None:
    assert rules.report(None, stop) == ended


# --- the plan ----------------------------------------------------------------------------------


@pytest.mark.parametrize("routes_cancelled", [True, False])
@pytest.mark.parametrize("success", [SUCCESS, None])
@pytest.mark.parametrize("cancelled", [CANCELLED, None])
def test_a_success_tries_the_live_row_then_the_cancelled_one(
    routes_cancelled: bool, success: Route | None, cancelled: Route | None
) -> None:
    plan = rules.decide(
        Succeeded(success, cancelled), claim(), routes_cancelled=routes_cancelled, backoff_ms=9
    )
    # Cancelled meanwhile: the on_cancelled report when routed, else on_success as usual.
    fallback = cancelled if routes_cancelled else success
    assert plan == Deliver(success, fallback, cancelled)


@pytest.mark.parametrize("routes_cancelled", [True, False])
@pytest.mark.parametrize("cancelled", [CANCELLED, None])
def test_a_rejected_value_is_a_failure_whose_cancellation_report_goes_first(
    routes_cancelled: bool, cancelled: Route | None
) -> None:
    failure = Failure("refused", ambiguous=True, final=True)
    plan = rules.decide(
        Rejected(failure, cancelled), claim(), routes_cancelled=routes_cancelled, backoff_ms=9
    )
    first = cancelled if routes_cancelled else None
    assert plan == RecordFailure(failure, first, cancelled, rejected=True, backoff_ms=9)


def test_a_failure_is_recorded_with_its_backoff() -> None:
    plan = rules.decide(Failed(FAILURE), claim(2), routes_cancelled=True, backoff_ms=2000)
    assert plan == RecordFailure(FAILURE, None, None, rejected=False, backoff_ms=2000)


def test_an_interrupted_attempt_ends_cancelled_as_unknown() -> None:
    plan = rules.decide(Interrupted(), claim(3), routes_cancelled=False, backoff_ms=0)
    assert plan == EndCancelled(3, "Unknown", rules.cancelled_cause(3))
    assert "attempt 3" in plan.cause and "may have applied" in plan.cause


def test_a_row_cancelled_before_any_attempt_is_dropped() -> None:
    for exhausted, ambiguous in itertools.product([True, False], repeat=2):
        row = claim(0, cancelled=True, exhausted=exhausted, ambiguous=ambiguous)
        assert rules.decide(Unattempted(), row, routes_cancelled=True, backoff_ms=0) == Drop()


@pytest.mark.parametrize(
    ("ambiguous", "maybe_applied", "last_error"),
    list(itertools.product([True, False], [True, False], ["RuntimeError: x", None])),
)
def test_a_cancelled_row_claimed_to_settle_reports_what_it_recorded(
    ambiguous: bool, maybe_applied: bool, last_error: str | None
) -> None:
    row = claim(
        2, cancelled=True, ambiguous=ambiguous, maybe_applied=maybe_applied, last_error=last_error
    )
    plan = rules.decide(Unattempted(), row, routes_cancelled=False, backoff_ms=0)
    maybe = ambiguous or maybe_applied
    if last_error is not None:
        cause = last_error
    elif maybe:
        cause = rules.cancelled_cause(2)
    else:
        cause = "Failed before it was cancelled"
    assert plan == EndCancelled(2, "Unknown" if maybe else "Failed", cause)


@pytest.mark.parametrize("ambiguous", [True, False])
@pytest.mark.parametrize("last_error", ["TimeoutError: slow", None])
def test_an_exhausted_row_claimed_to_settle_is_dead_lettered(
    ambiguous: bool, last_error: str | None
) -> None:
    row = claim(3, exhausted=True, ambiguous=ambiguous, last_error=last_error)
    plan = rules.decide(Unattempted(), row, routes_cancelled=True, backoff_ms=0)
    assert plan == Exhaust(3, last_error or "No attempt reported", ambiguous)


# --- what a recorded failure leads to ----------------------------------------------------------

RECORDED: list[Recorded | None] = [
    None,
    *(Recorded(*flags) for flags in itertools.product([True, False], repeat=3)),
]


@pytest.mark.parametrize("recorded", RECORDED)
@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize(("attempt", "attempts"), [(1, 3), (2, 3), (3, 3), (1, 1)])
@pytest.mark.parametrize("rejected", [True, False])
@pytest.mark.parametrize("first", [CANCELLED, None])
def test_after_record(
    recorded: Recorded | None,
    final: bool,
    attempt: int,
    attempts: int,
    rejected: bool,
    first: Route | None,
) -> None:
    failure = Failure("RuntimeError: boom", ambiguous=False, final=final)
    plan = RecordFailure(failure, first, CANCELLED, rejected=rejected, backoff_ms=1000)
    then = rules.after_record(plan, recorded, attempt=attempt, attempts=attempts)
    if recorded is None:
        # A newer attempt or a settle took the row: a rejected value was applied, so late.
        assert then == Stale(late=rejected)
    elif recorded.cancelled:
        # Cancelled meanwhile: ends as cancelled, its route taking the result first.
        unknown = recorded.ambiguous or recorded.maybe_applied
        outcome: rules.Known = "Unknown" if unknown else "Failed"
        assert then == EndCancelled(attempt, outcome, failure.cause, first=first)
    elif final or attempt >= attempts:
        # The ambiguity the row recorded (this attempt's or an earlier one's) is the letter's.
        assert then == Exhaust(attempt, failure.cause, recorded.ambiguous)
    else:
        assert then == Retry(failure.cause, recorded.ambiguous)


# --- how a cancelled row ends ------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["Failed", "Unknown"])
@pytest.mark.parametrize("route", [CANCELLED, None])
def test_a_cancelled_row_ends_into_its_report_else_unknown_is_dead_lettered(
    outcome: rules.Known, route: Route | None
) -> None:
    end = rules.cancelled_end(outcome, route)
    if route is not None:
        assert end == Report(route, dead_letter=False)
    else:
        # Nobody is told of an Unknown outcome otherwise; a Failed one cannot have applied.
        assert end == Report(None, dead_letter=outcome == "Unknown")


@pytest.mark.parametrize("ambiguous", [True, False])
@pytest.mark.parametrize("maybe_applied", [True, False, None])
def test_a_dead_letter_beaten_by_a_cancellation_ends_the_row_cancelled(
    ambiguous: bool, maybe_applied: bool | None
) -> None:
    plan = Exhaust(4, "RuntimeError: last", ambiguous)
    then = rules.after_lost_letter(plan, maybe_applied)
    if maybe_applied is None:
        assert then is None  # not cancelled at this attempt: another settle took the row
    else:
        outcome: rules.Known = "Unknown" if ambiguous or maybe_applied else "Failed"
        assert then == EndCancelled(4, outcome, "RuntimeError: last")


@pytest.mark.parametrize("routes_cancelled", [True, False])
@pytest.mark.parametrize("cancelled", [CANCELLED, None])
@pytest.mark.parametrize("in_workflow", [True, False])
def test_a_late_success(routes_cancelled: bool, cancelled: Route | None, in_workflow: bool) -> None:
    letter = rules.late(cancelled, routes_cancelled=routes_cancelled, in_workflow=in_workflow)
    if not routes_cancelled or cancelled is None:
        assert letter == "none"
    else:
        assert letter == ("workflow" if in_workflow else "letter")


def test_known_is_failed_only_when_nothing_can_have_applied() -> None:
    table = {(a, m): rules.known(a, m) for a, m in itertools.product([True, False], repeat=2)}
    assert table == {
        (True, True): "Unknown",
        (True, False): "Unknown",
        (False, True): "Unknown",
        (False, False): "Failed",
    }


def test_backoff_doubles_up_to_its_max() -> None:
    job = Shop.charge
    assert [rules.backoff_ms(job, n) for n in range(1, 6)] == [1000, 2000, 4000, 4000, 4000]


# --- a returned value and its routes -----------------------------------------------------------


def test_a_value_the_routes_accept_succeeds_with_both_routes() -> None:
    reported = rules.classify_value(Shop.charge, claim(2), 3)
    assert isinstance(reported, Succeeded)
    assert reported.success is not None and reported.success.command == "charged"
    assert json.loads(reported.success.payload) == {"result": 3}
    assert reported.cancelled is not None and reported.cancelled.command == "charge_cancelled"
    report = json.loads(reported.cancelled.payload)["report"]
    assert report["outcome"] == {"kind": "Succeeded", "value": 3}
    assert (report["job_id"], report["attempts"], report["ambiguous"]) == ("job-1", 2, False)


def test_a_value_on_success_refuses_is_a_final_ambiguous_failure() -> None:
    reported = rules.classify_value(Shop.charge, claim(), 1.5)
    assert isinstance(reported, Rejected)
    assert reported.failure.final and reported.failure.ambiguous
    assert reported.failure.cause.startswith("The on_success route cannot accept the result: ")
    # The cancellation's report cannot carry the value either: it reports Unknown instead.
    assert reported.cancelled is not None
    outcome = json.loads(reported.cancelled.payload)["report"]["outcome"]
    assert outcome["kind"] == "Unknown"
    assert outcome["cause"].startswith("The on_cancelled route cannot accept the result: ")


def test_a_job_without_routes_succeeds_with_none() -> None:
    assert rules.classify_value(Plain.ping, claim(), 1) == Succeeded(None, None)


def test_a_workflow_steps_job_routes_every_outcome_to_its_step() -> None:
    step = caller_to_json(System(source="workflow", workflow=("run-1", 4)))
    reported = rules.classify_value(Plain.ping, claim(caller=step), 7)
    assert isinstance(reported, Succeeded)
    assert reported.success is not None and reported.cancelled is not None
    assert reported.success.command == reported.cancelled.command == WorkflowCommand.JOB
    body = json.loads(reported.success.payload)
    assert body == {"run_id": "run-1", "seq": 4, "outcome": {"ok": 7}}
    cancelled = json.loads(reported.cancelled.payload)["outcome"]["cancelled"]
    assert cancelled["outcome"] == {"kind": "Succeeded", "value": 7}
