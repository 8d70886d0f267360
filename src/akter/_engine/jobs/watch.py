"""Due job rows no live runner serves (evolution E3), checked by the ``$maintenance`` owner.

Each sample groups the due, unparked job rows by (actor type, stored job name) and compares
them with the job types the live runners execute (their registrations) and with this code's
definitions:

- a job this code declares (by name or alias) that no live runner executes is **unserved**: a
  worker may simply be down, so its rows stay due; the gauge ``akter.jobs.unserved`` counts
  them and a warning is logged once per type per hour;
- a job of a hosted type that this code does not declare nor alias, but a live runner's code
  declares (a rolling deploy that added it; that runner may execute no jobs itself), is
  **unserved** as well: its rows stay due for the newer code's workers;
- a job of a hosted type that no live runner's code declares nor executes can never run: its
  rows are **parked**, like a row the executor could not decode.

Types this code does not host are left alone: another deployment may own them (and
``akter.orphans`` reports stored names no definition claims).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from akter._engine.parking import OncePer
from akter._store.gateway.parked import DueJobs, ParkedGateway

if TYPE_CHECKING:
    from akter._engine.services import Registry
    from akter._store.gateway.runners import LiveRunner

log = logging.getLogger("akter.jobs")

#: Rows one sweep parks per (type, job) and statement.
PARK_BATCH = 1_000

#: Unserved jobs are logged once per actor type per hour (per sampler).
LOG_EVERY_S = 3600


@dataclass(frozen=True)
class Unserved:
    """Due rows of a declared job that no live runner executes."""

    actor_type: str
    job: str
    due: int


def served_names(runners: Iterable[LiveRunner]) -> set[str]:
    """The ``Type.job`` names the live runners execute (their registrations)."""
    return {name for runner in runners for name in runner.job_types}


async def watch(
    gateway: ParkedGateway,
    registry: Registry,
    due: Iterable[DueJobs],
    served: set[str],
    logged: OncePer,
    *,
    declared_elsewhere: Callable[[str, str], Awaitable[bool]] | None = None,
) -> list[Unserved]:
    """Park undeclared unserved jobs' rows; return the declared ones nobody serves.

    ``logged`` limits the unserved warning (one per actor type per :data:`LOG_EVERY_S`);
    ``declared_elsewhere(type, job)``: whether a live runner's code declares the job.
    """
    unserved: list[Unserved] = []
    for row in due:
        actor_type, stored = row.actor_type, row.job
        definition = registry.definitions.get(actor_type)
        if definition is None:
            continue  # not a type of this deployment's code
        job = definition.job(stored)
        names = {f"{actor_type}.{stored}"}
        if job is not None:
            names.add(f"{actor_type}.{job.name}")
        if names & served:
            continue
        if job is not None or (
            declared_elsewhere is not None and await declared_elsewhere(actor_type, stored)
        ):
            unserved.append(Unserved(actor_type, stored, row.due))
            if logged.allow(actor_type):
                log.warning(
                    "Due job rows that no live runner executes: job %s of %s (%d due); start a "
                    "runner whose code declares it",
                    stored,
                    actor_type,
                    row.due,
                    extra={"actor": actor_type, "job": stored, "due": row.due},
                )
            continue
        cause = (
            f"UnknownJob: actor type {actor_type!r} declares no job {stored!r} (nor an alias of "
            f"it) and no live runner executes it; add aliases=({stored!r},) to the job that "
            "replaced it, then retry the parked rows."
        )
        while True:
            parked = await gateway.park_undeclared(
                actor_type, stored, error=cause, batch=PARK_BATCH
            )
            if parked:
                log.warning(
                    "Job rows parked: no definition declares their job: job %s of %s (%d rows): %s",
                    stored,
                    actor_type,
                    parked,
                    cause,
                    extra={"actor": actor_type, "job": stored, "parked": parked},
                )
            if parked < PARK_BATCH:
                break
    return unserved
