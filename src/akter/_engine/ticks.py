"""Schedule ticks (semantics §4.5): the first ticks of an actor, the next one, and whether to fire.

A schedule entry has one pending tick row in the outbox. The first ticks are written when the
actor's first turn commits (or, for a singleton, at start); each delivered or skipped tick is
rewritten into the next one, due at the entry's first fire strictly after the claim's clock, with
a fresh framework id. A tick older than the type's ``max_schedule_lag`` is skipped, not fired; a
tick of an entry this code no longer declares is left to a newer runner while it is young.
"""

from __future__ import annotations

from typing import Any, Literal

from akter._ids import bucket
from akter._staging import framework_id
from akter._store.gateway import actors
from akter.actor import ActorDefinition
from akter.callers import ActorRef, System, caller_to_json
from akter.schedules import next_fire

#: What to do with a claimed tick.
TickDecision = Literal["fire", "skip", "defer", "drop"]


def first_ticks(
    definition: ActorDefinition, ref: ActorRef, routing_key: int, now_ms: int, window_ms: int
) -> actors.Params:
    """Parameters of ``insert_ticks``: one pending tick per schedule entry of the actor."""
    dues = [next_fire(entry, now_ms) for entry in definition.schedules]
    return actors.tick_params(
        actors.actor_key(routing_key, ref.tenant, ref.type, ref.id),
        bucket=bucket(routing_key),
        caller=caller_to_json(System(source="cron", ref=ref)),
        intent_ids=[framework_id(now_ms, None, due, 0, window_ms) for due in dues],  # absolute
        commands=[entry.command for entry in definition.schedules],
        dues=dues,
        keys=[entry.key for entry in definition.schedules],
        versions=[definition.member(e.command, "command").version for e in definition.schedules],
    )


def next_tick(entry: Any, now_ms: int, window_ms: int) -> tuple[str, int]:
    """The id and due time of the tick after one settled at ``now_ms`` (first fire after it)."""
    due = next_fire(entry, now_ms)
    return framework_id(now_ms, None, due, 0, window_ms), due


def decide(age_ms: int, lag_ms: int, declared: bool) -> TickDecision:
    """Fire a claimed tick, skip it (too late: rewrite to the next), defer or drop an unknown one.

    ``age_ms`` is the claim's clock minus the tick's scheduled time. An entry this runner does not
    declare is deferred (backed off) while younger than the lag, since a newer runner may own
    it, and dropped (settled) after.
    """
    if not declared:
        return "drop" if age_ms > lag_ms else "defer"
    return "skip" if age_ms > lag_ms else "fire"
