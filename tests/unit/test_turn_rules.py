"""The turn's decision rules, without a database (semantics §2.3, §1.4, §1.5).

``rules.decide`` is what a command gets before its handler runs, in order: future ids, receipts
(replay, another caller, conflicts), expiry, internal commands, the creation gate, minted
children. ``rules.release`` is the check after the transaction; ``BatchWrites`` merges staged
work; ``writes.plan`` decides whether the commit flight writes at all.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

import akter
from akter import telemetry
from akter._engine.turn import rules, writes
from akter._engine.turn.types import (
    Activation,
    BatchDefect,
    BatchRun,
    BatchWrites,
    Outcome,
    Request,
    Result,
)
from akter._ids import CommandId, child_id
from akter._kinds import RowKind
from akter._staging import (
    CancelJob,
    CancelTimer,
    Staged,
    StagedEvent,
    StagedRow,
    StagedRun,
    due_and_slack,
    framework_id,
)
from akter.actor import ActorDefinition, definition_of
from akter.callers import ActorRef, Anonymous, Caller, System, User, caller_key
from akter.context import LoopLease
from akter.errors import ActorError, DeclaredError

NOW = 1_700_000_000_000
WINDOW = 86_400_000


class Count(BaseModel):
    n: int = 0


class Refused(DeclaredError, tag="rules-test.Refused"):
    why: str


class Plain(akter.Actor[Count], name="RulesPlain"):
    @akter.command
    async def add(self, by: int) -> int:
        return by

    @akter.command(internal=True)
    async def sweep(self) -> None:
        return None


class Gated(akter.Actor[Count], name="RulesGated"):
    @akter.command(creates=True)
    async def open(self) -> None:
        return None

    @akter.command
    async def add(self, by: int) -> int:
        return by


PLAIN = definition_of(Plain)
GATED = definition_of(Gated)


#: Requests carry a future; no loop ever runs in these tests.
_LOOP = asyncio.new_event_loop()


def _request(
    definition: ActorDefinition = PLAIN,
    command: str = "add",
    *,
    ref: ActorRef | None = None,
    caller: Caller | None = None,
    external: bool = True,
    issued: int = NOW - 1_000,
    expires: int = NOW + WINDOW,
    payload_hash: str = "h1",
    fence: LoopLease | None = None,
) -> Request:
    raw = f"v1.{issued}.{expires}.{uuid.uuid4()}"
    return Request(
        member=definition.member(command),
        ref=ref or ActorRef("t1", definition.name, "a-1"),
        payload={},
        payload_hash=payload_hash,
        command_id=CommandId(raw, issued, expires),
        caller=caller or User("alice"),
        external=external,
        future=_LOOP.create_future(),
        fence=fence,
    )


def _decide(
    request: Request,
    *,
    definition: ActorDefinition = PLAIN,
    now: int = NOW,
    receipts: dict[str, Any] | None = None,
    created: bool = True,
) -> Result | None:
    return rules.decide(request, definition, request.ref, now, receipts or {}, created, 3)


def _receipt(request: Request, outcome: dict[str, Any], **changes: Any) -> dict[str, Any]:
    stored = {
        "command_id": request.command_id.raw,
        "caller_key": request.caller_key,
        "command": request.member.name,
        "payload_hash": request.payload_hash,
        "outcome": outcome,
    }
    return {request.command_id.raw: {**stored, **changes}}


def _reason(result: Result | None) -> tuple[str, str | None]:
    assert result is not None and result.kind == "error"
    assert isinstance(result.error, ActorError)
    return result.error.reason, result.error.code


# --- decide ------------------------------------------------------------------------------------


def test_a_fresh_command_runs() -> None:
    assert _decide(_request()) is None


def test_a_future_id_is_refused_as_retryable_with_its_wait() -> None:
    request = _request(issued=NOW + 1_500)
    result = _decide(request)
    assert _reason(result) == ("InvalidCommandId", "future")
    assert isinstance(result.error, ActorError)  # type: ignore[union-attr]
    assert result.error.retryable is True  # type: ignore[union-attr]
    assert result.error.retry_after == 1.5  # type: ignore[union-attr]
    assert result.error.command_id == request.command_id.raw  # type: ignore[union-attr]


def test_a_future_id_is_checked_for_external_callers_only() -> None:
    assert _decide(_request(issued=NOW + 1_500, external=False, caller=System("actor"))) is None


def test_an_id_issued_exactly_now_is_not_in_the_future() -> None:
    assert _decide(_request(issued=NOW)) is None


def test_a_stored_receipt_replays_its_outcome() -> None:
    request = _request()
    result = _decide(request, receipts=_receipt(request, {"ok": 7}))
    assert result == Result("ok", value=7, replayed=True)


def test_a_receipt_replays_even_after_the_id_expired() -> None:
    request = _request(expires=NOW - 1)
    result = _decide(request, receipts=_receipt(request, {"ok": 1}))
    assert result is not None and result.replayed


def test_a_future_id_is_refused_before_its_receipt_is_looked_at() -> None:
    request = _request(issued=NOW + 10)
    result = _decide(request, receipts=_receipt(request, {"ok": 1}))
    assert _reason(result) == ("InvalidCommandId", "future")


def test_a_receipt_of_another_caller_is_refused() -> None:
    request = _request()
    stored = _receipt(request, {"ok": 1}, caller_key=caller_key(User("mallory")))
    assert _reason(_decide(request, receipts=stored)) == ("Unauthorized", "receipt_access_denied")


@pytest.mark.parametrize("changed", [{"command": "other"}, {"payload_hash": "h2"}])
def test_a_receipt_of_another_command_or_payload_is_a_conflict(changed: dict[str, str]) -> None:
    request = _request()
    stored = _receipt(request, {"ok": 1}, **changed)
    assert _reason(_decide(request, receipts=stored)) == ("CommandConflict", None)


def test_a_replayed_declared_error_keeps_its_fields() -> None:
    request = _request()
    outcome = {"error": "rules-test.Refused", "fields": {"why": "no"}}
    result = _decide(request, receipts=_receipt(request, outcome))
    assert result is not None and result.kind == "declared" and result.replayed
    assert isinstance(result.error, Refused) and result.error.why == "no"


@pytest.mark.parametrize("expires", [NOW, NOW - 1])
def test_an_expired_first_execution_is_refused(expires: int) -> None:
    assert _reason(_decide(_request(expires=expires))) == ("CommandExpired", None)


def test_expiry_applies_to_external_callers_only() -> None:
    assert _decide(_request(expires=NOW - 1, external=False, caller=System("actor"))) is None


@pytest.mark.parametrize("caller", [User("alice"), Anonymous()])
def test_an_internal_command_from_a_non_system_caller_is_a_defect(caller: Caller) -> None:
    with pytest.raises(BatchDefect) as raised:
        _decide(_request(command="sweep", caller=caller))
    assert raised.value.index == 3
    assert "only the framework may send it" in raised.value.message


def test_an_internal_command_from_system_runs() -> None:
    assert _decide(_request(command="sweep", caller=System("actor"), external=False)) is None


def test_a_gated_actor_refuses_everything_but_creating_commands_until_created() -> None:
    add = _request(GATED, "add")
    assert _reason(_decide(add, definition=GATED, created=False)) == ("NotCreated", None)
    assert _decide(_request(GATED, "open"), definition=GATED, created=False) is None
    assert _decide(add, definition=GATED, created=True) is None


def _minted(ordinal: int = 0, parent_command: str = "v1.1.2.p") -> tuple[ActorRef, System]:
    parent = ActorRef("t1", "Parent", "p-1")
    child = child_id(
        tenant="t1",
        parent_type="Parent",
        parent_id="p-1",
        parent_command_id=parent_command,
        ordinal=ordinal,
        child_type=PLAIN.name,
    )
    return ActorRef("t1", PLAIN.name, child), System(
        "actor", ref=parent, mint=(parent_command, ordinal)
    )


def test_a_minted_child_runs_its_first_command_with_its_parents_proof() -> None:
    ref, caller = _minted()
    request = _request(ref=ref, caller=caller, external=False)
    assert rules.valid_mint(request, ref)
    assert _decide(request, created=False) is None


def test_a_minted_child_refuses_a_first_command_without_the_proof() -> None:
    ref, _ = _minted()
    request = _request(ref=ref, caller=User("alice"))
    assert _reason(_decide(request, created=False)) == ("Unauthorized", "access_denied")
    assert _decide(request, created=True) is None  # once created, anyone allowed may call


@pytest.mark.parametrize(
    "caller",
    [
        System("actor", ref=ActorRef("t1", "Parent", "p-1"), mint=("v1.1.2.p", 1)),  # ordinal
        System("actor", ref=ActorRef("t2", "Parent", "p-1"), mint=("v1.1.2.p", 0)),  # tenant
        System("actor", ref=ActorRef("t1", "Other", "p-1"), mint=("v1.1.2.p", 0)),  # parent type
        System("timer", ref=ActorRef("t1", "Parent", "p-1"), mint=("v1.1.2.p", 0)),  # source
        System("actor", ref=None, mint=("v1.1.2.p", 0)),
        System("actor", ref=ActorRef("t1", "Parent", "p-1")),
    ],
)
def test_a_wrong_mint_proof_is_refused(caller: System) -> None:
    ref, _ = _minted()
    assert not rules.valid_mint(_request(ref=ref, caller=caller, external=False), ref)


def test_an_external_call_never_carries_a_mint_proof() -> None:
    ref, caller = _minted()
    assert not rules.valid_mint(_request(ref=ref, caller=caller, external=True), ref)


# --- release -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ok", "declared"])
def test_release_hides_an_outcome_whose_id_expired_by_the_end(kind: str) -> None:
    request = _request(expires=NOW + 10)
    result = Result(kind, value=1)  # type: ignore[arg-type]
    assert rules.release(result, request, NOW + 9) is result
    assert _reason(rules.release(result, request, NOW + 10)) == ("CommandExpired", None)


def test_release_passes_errors_and_internal_callers() -> None:
    request = _request(expires=NOW)
    error = Result("error", error=ActorError("Defect", "x"))
    assert rules.release(error, request, NOW + 1) is error
    internal = _request(expires=NOW, external=False, caller=System("actor"))
    ok = Result("ok", value=1)
    assert rules.release(ok, internal, NOW + 1) is ok


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.booleans())
def test_release_is_expiry_on_the_release_clock(expires: int, at: int, external: bool) -> None:
    request = _request(expires=expires, external=external, caller=User("a"))
    released = rules.release(Result("ok", value=1), request, at)
    assert (released.kind == "error") == (external and at >= expires)


# --- other rules -------------------------------------------------------------------------------


def test_receipt_result_keeps_a_value_its_annotation_no_longer_accepts() -> None:
    member = PLAIN.member("add")
    assert rules.receipt_result(member, {"ok": "7"}) == Result("ok", value=7)
    assert rules.receipt_result(member, {"ok": [1]}) == Result("ok", value=[1])


def test_unavailable_is_honest_about_the_outcome() -> None:
    request = _request()
    unknown = rules.unavailable(request, "why", True)
    assert _reason(unknown) == ("ActorUnavailable", "outcome_unknown")
    assert "may or may not have committed" in str(unknown.error)
    known = rules.unavailable(request, "why", False)
    assert _reason(known) == ("ActorUnavailable", None)
    assert "it was not committed" in str(known.error)


def test_lease_lost_names_the_lease() -> None:
    request = _request(fence=LoopLease("Loop", "runner-1", 42, 7))
    error = rules.lease_lost(request)
    assert error.reason == "LeaseLost" and "epoch 42" in error.message


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        (Result("ok", replayed=True), "replay"),
        (Result("ok"), "success"),
        (Result("declared"), "failure"),
        (Result("error", error=ActorError("Defect", "x")), "defect"),
        (Result("error", error=ActorError("ActorUnavailable", "x")), "retry"),
        (Result("error", error=ActorError("NotCreated", "x")), "refused"),
    ],
)
def test_turn_outcomes(result: Result, outcome: str) -> None:
    reason = getattr(result.error, "reason", "")
    assert telemetry.turn_outcome(result.kind, result.replayed, reason) == outcome


# --- staged work -------------------------------------------------------------------------------


def _row(key: str | None, kind: str = "intent", command: str = "add") -> StagedRow:
    return StagedRow(
        f"id-{uuid.uuid4()}", RowKind(kind), "T", "x", command, "{}", "{}", 0, None, key
    )


def test_the_last_staging_of_a_timer_key_wins() -> None:
    first, second, other = _row("k"), _row("k"), _row("j")
    staged = Staged(ops=[CancelTimer("k"), first, other, CancelTimer("k"), second])
    merged = BatchWrites()
    merged.apply(staged, "c1")
    assert merged.rows == [other, second]
    assert merged.timer_deletes == ["k"]


def test_a_job_cancellation_drops_only_jobs_of_that_key() -> None:
    job, timer = _row("$job:k", "job"), _row("$job:k", "intent")
    merged = BatchWrites()
    merged.apply(Staged(ops=[job, timer]), "c1")
    merged.apply(Staged(ops=[CancelJob("$job:k"), CancelJob("$job:k")]), "c2")
    assert merged.rows == [timer]
    assert merged.job_cancels == ["$job:k"]
    assert merged.timer_deletes == []


def test_events_keep_their_command_ids_in_order() -> None:
    merged = BatchWrites()
    a, b, c = StagedEvent("A", "1"), StagedEvent("B", "2", 1), StagedEvent("C", "3")
    merged.apply(Staged(events=[a, b]), "c1")
    merged.apply(Staged(events=[c]), "c2")
    assert merged.events == [(a, "c1"), (b, "c1"), (c, "c2")]
    assert not merged.empty and BatchWrites().empty


class Capped(akter.Actor[Count], name="RulesCapped"):
    @akter.command
    async def go(self) -> None:
        return None

    @akter.job(per_actor=2)
    async def capped(call: akter.JobCall, req: Count) -> None:
        return None

    @akter.job()
    async def free(call: akter.JobCall, req: Count) -> None:
        return None


def test_ordinals_count_capped_jobs_only() -> None:
    rows = [
        _row(None, "job", "capped"),
        _row(None, "job", "free"),
        _row(None, "intent", "capped"),
        _row(None, "job", "capped"),
    ]
    assert writes.ordinals(definition_of(Capped), rows) == [1, 0, 0, 2]


def _activation(definition: ActorDefinition = PLAIN) -> Activation:
    act = Activation(definition, ActorRef("t1", definition.name, "a-1"), 7)
    act.loaded, act.state_json, act.created, act.event_seq = Count(), '{"n":0}', True, 4
    return act


def _run(act: Activation, outcomes: list[Outcome], **changes: Any) -> BatchRun:
    ran = BatchRun(outcomes, BatchWrites(), act.state_json, act.created, act.event_seq)
    for name, value in changes.items():
        setattr(ran, name, value)
    return ran


def test_a_batch_without_writes_rolls_back() -> None:
    act = _activation()
    request = _request()
    refused = Outcome(Result("error", error=ActorError("NotCreated", "x")))
    todo = writes.plan(act, [request], _run(act, [refused]), set(), NOW, WINDOW)
    assert todo.nothing and not todo.state_changed and todo.receipts == []


@pytest.mark.parametrize(
    "changes",
    [{"state_json": '{"n":1}'}, {"created": False}, {"event_seq": 5}],
)
def test_a_changed_actor_row_is_written(changes: dict[str, Any]) -> None:
    act = _activation()
    outcome = Outcome(Result("ok"))
    todo = writes.plan(act, [_request()], _run(act, [outcome], **changes), set(), NOW, WINDOW)
    assert todo.state_changed and not todo.nothing


def test_a_receipt_alone_is_written() -> None:
    act = _activation()
    request = _request()
    outcome = Outcome(Result("ok"), receipt='{"ok":null}', expires_ms=9)
    todo = writes.plan(act, [request], _run(act, [outcome]), set(), NOW, WINDOW)
    assert todo.receipts == [(outcome, request)] and not todo.nothing


def test_only_current_leases_are_held_once_each() -> None:
    act = _activation()
    lease = LoopLease("Loop", "r1", 1, 7)
    batch = [
        _request(fence=lease),
        _request(fence=lease),
        _request(fence=LoopLease("L", "r", 2, 8)),
    ]
    outcomes = [Outcome(Result("ok")) for _ in batch]
    todo = writes.plan(act, batch, _run(act, outcomes), {2}, NOW, WINDOW)
    assert todo.fences == [lease] and todo.fences_until is None
    # The commit flight's clock check takes the earliest end of the leases it holds.
    ends = {0: NOW + 900, 1: NOW + 700, 2: NOW - 1}
    todo = writes.plan(act, batch, _run(act, outcomes), {2}, NOW, WINDOW, ends)
    assert todo.fences == [lease] and todo.fences_until == NOW + 700
    unfenced = writes.plan(act, [_request()], _run(act, outcomes[:1]), set(), NOW, WINDOW)
    assert unfenced.fences == [] and unfenced.fences_until is None


class Ticking(akter.Actor[Count], name="RulesTicking"):
    @akter.schedule(every=60)
    @akter.command
    async def tick(self) -> None:
        return None


def test_a_cold_scheduled_actor_makes_sure_of_its_ticks_once_created() -> None:
    act = _activation(definition_of(Ticking))
    outcomes = [Outcome(Result("ok"))]
    todo = writes.plan(
        act, [_request(definition_of(Ticking), "tick")], _run(act, outcomes), set(), NOW, WINDOW
    )
    assert todo.ticks is not None and len(todo.ticks["keys"]) == 1
    assert not todo.nothing
    act.ticks_ensured = True
    again = writes.plan(
        act, [_request(definition_of(Ticking), "tick")], _run(act, outcomes), set(), NOW, WINDOW
    )
    assert again.ticks is None and again.nothing
    act.ticks_ensured, act.created = False, False
    uncreated = _run(act, outcomes, created=False)
    assert (
        writes.plan(
            act, [_request(definition_of(Ticking), "tick")], uncreated, set(), NOW, WINDOW
        ).ticks
        is None
    )


# --- the due rule ------------------------------------------------------------------------------


def test_due_and_slack() -> None:
    assert due_and_slack(NOW, None, NOW + 5, 30_000) == (NOW + 5, 0)  # absolute: no slack
    assert due_and_slack(NOW, 5, None, 30_000) == (NOW + 5, 30_000)  # relative: the timeout
    assert due_and_slack(NOW, 0, None, 30_000) == (NOW, 30_000)
    assert due_and_slack(NOW, None, None, 30_000) == (NOW, 0)  # an immediate intent


@given(
    st.integers(0, 2**41),
    st.one_of(st.none(), st.integers(0, 2**31)),
    st.one_of(st.none(), st.integers(0, 2**42)),
    st.integers(1, 2**31),
)
def test_a_framework_id_expires_after_its_due_time_plus_slack_and_window(
    now: int, delay: int | None, at: int | None, timeout: int
) -> None:
    if delay is not None and at is not None:
        delay = None  # staging never gives both
    _, issued, expires, _ = framework_id(now, delay, at, timeout, WINDOW).split(".")
    due, slack = due_and_slack(now, delay, at, timeout)
    assert int(issued) == now
    assert int(expires) == max(due, now) + slack + WINDOW


def test_a_batch_names_each_keyed_run_for_its_later_commands() -> None:
    def run(key: str | None, workflow: str = "w") -> StagedRun:
        return StagedRun(f"r-{uuid.uuid4()}", workflow, key, "{}", "h", "{}", 1000)

    merged = BatchWrites()
    assert merged.keyed is None  # most batches start no keyed run: no mapping at all
    unkeyed, keyed = run(None), run("k")
    merged.apply(Staged(ops=[unkeyed]), "c1")
    assert merged.keyed is None and merged.runs == [unkeyed]
    merged.apply(Staged(ops=[keyed]), "c2")
    assert merged.keyed == {("w", "k"): keyed.run_id}
    # A re-run batch starts from the live runs its admission read.
    live = BatchWrites(keyed={("w", "k"): "live"})
    other = run("j")
    live.apply(Staged(ops=[other]), "c1")
    assert live.keyed == {("w", "k"): "live", ("w", "j"): other.run_id}
    assert not live.empty and BatchWrites().empty
