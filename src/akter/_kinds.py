"""The vocabularies of the outbox and of the workflow journal, named once.

An outbox row is of one :class:`RowKind`: an ``intent`` is a command the relay delivers to an
actor, a ``job`` an attempt the job executor runs. An intent's target is told by its command
and timer key (:func:`decode_intent`): a ``$workflow.*`` command goes to the workflow engine
(:class:`WorkflowCommand`), a ``$cron:`` timer key is a schedule's tick, anything else is the
actor's own command. A job row's ``$job:`` timer key is its key (:func:`job_timer_key`). A
workflow journal record is of one :class:`StepKind`.

The SQL catalogue and the schema use the same values; ``tests/unit/test_kinds.py`` checks that
every kind literal they compare or write is a member here. A new lane adds one value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RowKind(enum.StrEnum):
    """The kind of an outbox row (its ``kind`` column, checked by the schema)."""

    #: A command for an actor (or the workflow engine), delivered by the relay.
    INTENT = "intent"
    #: A job attempt, run by the job executor; its settle rewrites it into a route intent.
    JOB = "job"


class StepKind(enum.StrEnum):
    """The kind of a workflow journal record (``workflow_steps.kind``)."""

    COMMAND = "command"
    QUERY = "query"
    JOB = "job"
    SLEEP = "sleep"
    WAIT = "wait"
    #: A local function step (``wf.step``).
    STEP = "step"
    #: A recorded value (``wf.now()``, ``wf.uuid4()``, ``wf.random()``).
    VALUE = "value"
    #: A version marker (``wf.patched()``).
    PATCH = "patch"
    #: Where a cancellation (or the run's deadline) reached the code.
    CANCEL = "cancel"


#: The prefix of the commands of intents the workflow engine takes instead of an actor.
WORKFLOW_PREFIX = "$workflow."
#: The prefix of a schedule tick's timer key: ``$cron:<zone> <expression>``, ``$cron:@every``.
CRON_PREFIX = "$cron:"
#: The prefix of a keyed job's timer key.
JOB_PREFIX = "$job:"
#: The source type (``outbox.actor_type``) of an intent staged in the application's own
#: transaction (``akter.stage``): no actor sent it, so its ``actor_id`` is ``""``.
TRANSACTION_SOURCE = "$transaction"


class WorkflowCommand(enum.StrEnum):
    """The commands of the intents the workflow engine takes."""

    #: Start a run (staged by a turn's ``start_workflow``).
    START = "$workflow.start"
    #: A signal to a run.
    SIGNAL = "$workflow.signal"
    #: A cancellation of a run.
    CANCEL = "$workflow.cancel"
    #: A job step's outcome, written by the job's settle.
    JOB = "$workflow.job"


@dataclass(frozen=True, slots=True)
class ActorCommand:
    """An intent for the actor's own command ``command``."""

    command: str


@dataclass(frozen=True, slots=True)
class WorkflowIntent:
    """An intent for the workflow engine (``command`` starts with ``$workflow.``).

    ``command`` is kept as stored: one a newer code added is still the engine's to refuse.
    """

    command: str


@dataclass(frozen=True, slots=True)
class CronTick:
    """A schedule's tick: its timer key names the schedule entry whose command it runs."""

    key: str


#: Where an intent goes, decoded from its command and timer key.
IntentTarget = ActorCommand | WorkflowIntent | CronTick


def decode_intent(command: str, timer_key: str | None) -> IntentTarget:
    """The target of an intent row (module docstring): the one place the prefixes are read."""
    if command.startswith(WORKFLOW_PREFIX):
        return WorkflowIntent(command)
    if timer_key is not None and timer_key.startswith(CRON_PREFIX):
        return CronTick(timer_key)
    return ActorCommand(command)


def job_timer_key(key: str) -> str:
    """The timer key of the job row a job key names."""
    return JOB_PREFIX + key


def cron_timer_key(spec: str) -> str:
    """The timer key of a schedule's tick (``spec``: ``<zone> <expression>``, ``@every <ms>ms``)."""
    return CRON_PREFIX + spec


__all__ = [
    "CRON_PREFIX",
    "JOB_PREFIX",
    "TRANSACTION_SOURCE",
    "WORKFLOW_PREFIX",
    "ActorCommand",
    "CronTick",
    "IntentTarget",
    "RowKind",
    "StepKind",
    "WorkflowCommand",
    "WorkflowIntent",
    "cron_timer_key",
    "decode_intent",
    "job_timer_key",
]
