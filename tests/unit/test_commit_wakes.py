"""Which wake a local commit sends (``akter._engine.loop.wakes.CommitWakes``, issue 13 goal 4).

A commit that made only job rows due asks the relay for a jobs-only pass (one claim, not the
intent claim beside it) naming those rows, so the executor can claim them by key; a due intent
or timer asks for a full pass naming the intents (on Citus the relay claims them by key, no
scan: issue 45); rows due later wake nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from akter._engine.loop.wakes import CommitWakes
from akter._kinds import RowKind
from akter._staging import StagedRow
from akter._store.gateway.jobs import JobKey
from akter._store.gateway.outbox import IntentKey

NOW = 1_000_000


@dataclass
class Recorder:
    calls: list[str] = field(default_factory=list)
    keys: list[JobKey] = field(default_factory=list)
    intents: list[IntentKey] = field(default_factory=list)

    def wake(self) -> None:
        self.calls.append("wake")

    def wake_jobs(self, keys: Sequence[JobKey] = ()) -> None:
        self.calls.append(f"wake_jobs {len(keys)}" if keys else "wake_jobs")
        self.keys += keys

    def wake_intents(self, keys: Sequence[IntentKey]) -> None:
        self.calls.append(f"wake_intents {len(keys)}")
        self.intents += keys

    def poke_others(self) -> None:
        self.calls.append("poke")

    def cancel_signal(self, job_ids: list[str]) -> None:
        self.calls.append(f"signal {','.join(job_ids)}")

    def publish(self, ref: Any) -> None:
        self.calls.append("publish")


class Clock:
    def estimate(self) -> int:
        return NOW


def row(kind: str, *, delay_ms: int | None = None, at_ms: int | None = None) -> StagedRow:
    return StagedRow(
        intent_id=f"{kind}-1",
        kind=RowKind(kind),
        target_type="T",
        target_id="t",
        command="c",
        payload="{}",
        caller="x",
        delay_ms=delay_ms,
        at_ms=at_ms,
        timer_key=None,
    )


ACT = SimpleNamespace(ref=SimpleNamespace(type="Shop"), routing_key=42)


def commit(rows: list[StagedRow], cancelled: list[tuple[str, bool]] | None = None) -> Recorder:
    recorder = Recorder()
    on_commit = CommitWakes(Clock(), recorder, recorder, recorder)  # type: ignore[arg-type]
    on_commit(ACT, SimpleNamespace(rows=rows, events=[]), cancelled or [])
    return recorder


def wakes(rows: list[StagedRow], cancelled: list[tuple[str, bool]] | None = None) -> list[str]:
    return [c for c in commit(rows, cancelled).calls if c != "poke"]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row("job")], ["wake_jobs 1"]),
        ([row("job"), row("job", at_ms=NOW - 5)], ["wake_jobs 2"]),
        ([row("intent")], ["wake_intents 1"]),
        ([row("job"), row("intent")], ["wake_intents 1"]),
        ([row("job"), row("intent", at_ms=NOW)], ["wake_intents 1"]),
        # Due later: the poll (or the idle relay's next-due sleep) finds them.
        ([row("job", delay_ms=5_000)], []),
        ([row("job"), row("intent", delay_ms=5_000)], ["wake_jobs 1"]),
        ([row("intent", at_ms=NOW + 1)], []),
        ([], []),
    ],
)
def test_a_commit_wakes_the_relay_for_what_it_made_due(
    rows: list[StagedRow], expected: list[str]
) -> None:
    assert wakes(rows) == expected


def test_cancelled_jobs_signal_running_attempts_and_wake_job_claims_for_the_others() -> None:
    assert wakes([], [("j1", True)]) == ["signal j1"]
    assert wakes([], [("j1", True), ("j2", False)]) == ["signal j1", "wake_jobs"]
    assert wakes([row("intent")], [("j2", False)]) == ["wake_intents 1"]


def test_a_jobs_only_wake_names_each_due_row_by_its_actors_routing_key_and_its_job() -> None:
    due, later = row("job"), row("job", delay_ms=5_000)
    later.intent_id = "job-2"
    assert commit([due, later]).keys == [JobKey(42, "job-1", "Shop", "c")]


def test_an_intent_wake_names_each_due_intent_by_the_senders_routing_key_and_its_target() -> None:
    due, later, job = row("intent"), row("intent", delay_ms=5_000), row("job")
    later.intent_id = "intent-2"
    assert commit([due, later, job]).intents == [IntentKey(42, "intent-1", "T")]


def test_a_started_run_or_a_feed_write_still_asks_for_a_pass_without_names() -> None:
    recorder = Recorder()
    on_commit = CommitWakes(Clock(), recorder, recorder, recorder)  # type: ignore[arg-type]
    on_commit(ACT, SimpleNamespace(rows=[row("intent")], events=[], runs=["r"]), [])
    assert [c for c in recorder.calls if c != "poke"] == ["wake"]
