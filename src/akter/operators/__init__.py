"""The operator door: what the CLI, the HTTP routes, the console and the test kit do to a runtime.

Every operator object is reached from the runtime as ``runtime.operators.<name>``:

- ``dead_letters`` (:class:`DeadLetters`): jobs out of attempts; list, show, retry, discard;
- ``outbox`` (:class:`Outbox`): parked rows (retry, discard) and pending rows (overviews);
- ``workflows`` (:class:`Workflows`): runs by id (status, journal, signal, cancel, retry) and
  in lists;
- ``jobs`` (:class:`Jobs`): job rows, cancel by id, a job's progress;
- ``actors`` (:class:`Actors`): actors' durable rows (``akter inspect``, the console);
- ``database`` (:class:`Database`): the schema's migrations and Citus placement;
- ``runner`` (:class:`RunnerControl`): a harness's controls (fault points, clock, drain, death).

The surfaces (``akter.http``, ``akter.cli``, ``akter.testing``, ``akter.client``) use these and
the :class:`~akter.Runtime`, never the engine or the store (an import-linter contract).
"""

from __future__ import annotations

from dataclasses import dataclass

from akter.operators.actors import Actors
from akter.operators.database import Database
from akter.operators.dead_letters import DeadLetters, Letter
from akter.operators.jobs import Jobs
from akter.operators.outbox import Outbox, ParkedRow
from akter.operators.runner import RunnerControl
from akter.operators.workflows import RunDetail, RunSummary, Workflows


@dataclass(frozen=True)
class Operators:
    """A runtime's operator objects (module docstring): ``runtime.operators``."""

    dead_letters: DeadLetters
    outbox: Outbox
    workflows: Workflows
    jobs: Jobs
    actors: Actors
    database: Database
    runner: RunnerControl


__all__ = [
    "Actors",
    "Database",
    "DeadLetters",
    "Jobs",
    "Letter",
    "Operators",
    "Outbox",
    "ParkedRow",
    "RunDetail",
    "RunSummary",
    "RunnerControl",
    "Workflows",
]
