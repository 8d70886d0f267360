"""Which intents a pass may claim by key (``WakeChannel``, semantics §3.5.4, issue 45).

A pass's intent claim names intents only when every wake since the last pass that asked for
intent claims named its intents; any other wake (a freed slot, another runner's, an operator's)
means a scan. Jobs-only wakes ask for no intent claim.
"""

from __future__ import annotations

from types import SimpleNamespace

from akter._engine.loop.wake_channel import WakeChannel
from akter._store.gateway.jobs import JobKey
from akter._store.gateway.outbox import IntentKey

A, B = IntentKey(1, "i-a", "T"), IntentKey(2, "i-b", "T")
JOB = JobKey(3, "j-1", "T", "work")


def channel() -> WakeChannel:
    services = SimpleNamespace(store=None, config=SimpleNamespace(notify=False))
    return WakeChannel(services, heard=lambda: None, other=lambda: None)  # type: ignore[arg-type]


def test_named_intents_of_several_commits_reach_the_pass_together() -> None:
    c = channel()
    c.wake_intents([A])
    c.wake_intents([B])
    assert c.take() is None  # not jobs-only: every lane claims
    assert c.taken_intents == [A, B]
    assert c.event.is_set() is False


def test_any_unnamed_wake_before_or_after_the_named_ones_means_a_scan() -> None:
    c = channel()
    c.wake_intents([A])
    c.wake()
    c.take()
    assert c.taken_intents is None
    c.wake()
    c.wake_intents([B])
    c.take()
    assert c.taken_intents is None


def test_a_jobs_only_wake_then_named_intents_claims_those_and_every_job() -> None:
    c = channel()
    c.wake_jobs([JOB])
    c.wake_intents([A])
    assert c.take() is None  # the jobs lane claims in full, as after any intent wake
    assert c.taken_intents == [A]


def test_a_jobs_only_pass_names_no_intent() -> None:
    c = channel()
    c.wake_jobs([JOB])
    assert c.take() == [JOB]
    assert c.taken_intents == []


def test_too_many_named_intents_mean_a_scan() -> None:
    c = channel()
    c.wake_intents([IntentKey(i, f"i-{i}", "T") for i in range(200)])
    c.wake_intents([IntentKey(i, f"j-{i}", "T") for i in range(100)])
    c.take()
    assert c.taken_intents is None


def test_a_poll_names_nothing_left_from_an_earlier_pass() -> None:
    c = channel()
    c.wake_intents([A])
    c.take()
    c.take()  # the next pass started by the poll's timeout, no wake between
    assert c.taken_intents is None
