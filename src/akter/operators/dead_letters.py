"""Dead letters: jobs that ran out of attempts, kept for an operator (semantics §5.10).

Letters are never pruned. ``retry`` re-enqueues a letter's payload as a **new** job (the old id
may already hold a route receipt) marked ``maybe_applied`` when the letter was ambiguous, and
deletes the letter, in one transaction; ``discard`` deletes it.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from akter._evolution import PayloadTooNew
from akter._staging import framework_id
from akter._store.gateway.dead_letters import DeadLettersGateway, LetterRow
from akter.callers import ActorRef, System, caller_to_json
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.dead_letters")


@dataclass(frozen=True)
class Letter:
    """One dead letter.

    Attributes:
        job_id: The dead job's id.
        ref: The actor that owns the job.
        job: The job name.
        payload: The job's stored payload (JSON text).
        attempts: How many attempts it had.
        cause: The last attempt's cause.
        ambiguous: Whether the provider may have applied the call.
        dead_at_ms: When it was dead-lettered (framework clock).
    """

    job_id: str
    ref: ActorRef
    job: str
    payload: str
    payload_version: int
    attempts: int
    cause: str
    ambiguous: bool
    dead_at_ms: int
    routing_key: int

    def to_json(self) -> dict[str, Any]:
        """The letter as JSON (``akter dead-letters show``, the console): payload decoded."""
        return {
            "job_id": self.job_id,
            "ref": self.ref.to_json(),
            "job": self.job,
            "payload": json.loads(self.payload),
            "attempts": self.attempts,
            "cause": self.cause,
            "ambiguous": self.ambiguous,
            "dead_at_ms": self.dead_at_ms,
        }


def _letter(row: LetterRow) -> Letter:
    """The operators' view of a stored dead letter."""
    return Letter(
        job_id=row.job_id,
        ref=ActorRef(row.tenant_id, row.actor_type, row.actor_id),
        job=row.job,
        payload=row.payload,
        payload_version=row.payload_version,
        attempts=row.attempts,
        cause=row.cause,
        ambiguous=row.ambiguous,
        dead_at_ms=row.dead_at_ms,
        routing_key=row.routing_key,
    )


class DeadLetters:
    """Operator access to dead letters: ``list``, ``show``, ``retry`` and ``discard``.

    Args:
        services: A runner's services (started on the deployment's database when called).
        wake: Asks the relay for a pass (a retried letter's new job is due now).
    """

    def __init__(
        self, services: Services, *, wake: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._services = services
        self._gateway = DeadLettersGateway(services.store, services.clock)
        self._wake = wake

    async def list(self, limit: int = 1000) -> builtins.list[Letter]:
        """The newest ``limit`` letters, newest first."""
        return [_letter(r) for r in await self._gateway.list(limit)]

    async def show(self, job_id: str) -> Letter:
        """One letter by its job id.

        Raises:
            ActorError: ``InvalidInput/unknown_dead_letter`` when there is no such letter.
        """
        row = await self._gateway.find(job_id)
        if row is None:
            raise _unknown(job_id)
        return _letter(row)

    async def retry(self, job_id: str) -> str:
        """Re-enqueue a letter as a new job, due now, and delete the letter; returns the new id.

        The new row is ``maybe_applied`` when the letter was ambiguous, so its attempts stay
        honestly ambiguous. Its routes arrive with caller ``System("job", ref)``: the original
        principal is not kept with the letter.
        """
        letter = await self.show(job_id)
        self._revalidate(letter)
        now = await self._services.clock.read()
        new_id = framework_id(now, None, None, 0, self._services.config.window_ms)  # due now
        requeued = await self._gateway.requeue(
            letter.routing_key,
            job_id,
            new_id=new_id,
            tenant=letter.ref.tenant,
            actor_type=letter.ref.type,
            actor_id=letter.ref.id,
            job=letter.job,
            payload=letter.payload,
            payload_version=letter.payload_version,
            caller=caller_to_json(System(source="job", ref=letter.ref)),
        )
        if not requeued:
            raise _unknown(job_id)
        if letter.ambiguous:
            log.warning(
                "Retried an ambiguous dead letter; the provider may already have applied it: "
                "job %s of %s/%r (job id %r, new job id %r)",
                letter.job,
                letter.ref.type,
                letter.ref.id,
                job_id,
                new_id,
                extra={"job_id": job_id, "new_job_id": new_id, "job": letter.job},
            )
        if self._wake is not None:
            await self._wake()
        return new_id

    def _revalidate(self, letter: Letter) -> None:
        """Refuse a retry the current code could only fail again (evolution E3, EVO-12).

        The job is found by its stored name or an alias; its payload is decoded at its stored
        version (migrations, then validation). The letter is left as it was.

        Raises:
            ActorError: ``InvalidInput`` naming the field (or the unknown job).
        """
        definition = self._services.registry.definitions.get(letter.ref.type)
        job = definition.job(letter.job) if definition is not None else None
        if job is None:
            raise ActorError(
                "InvalidInput",
                f"Dead letter {letter.job_id!r}: no hosted type declares job "
                f"{letter.ref.type}.{letter.job} (nor an alias of it); add aliases=(...) to the "
                "job that replaced it, then retry.",
                code="unknown_member",
                field="job",
            )
        try:
            stored = json.loads(letter.payload)
            job.decode_payload(stored, letter.payload_version)
        except PayloadTooNew as exc:
            raise ActorError(
                "InvalidInput", f"Dead letter {letter.job_id!r}: {exc}", code="payload_too_new"
            ) from None
        except ActorError as exc:
            raise ActorError(
                "InvalidInput",
                f"Dead letter {letter.job_id!r} cannot be retried under the current code: "
                f"{exc.message} The letter was left as it was.",
                field=exc.field,
            ) from None
        except ValueError:
            raise ActorError(
                "InvalidInput", f"Dead letter {letter.job_id!r} holds a payload that is not JSON."
            ) from None

    async def discard(self, job_id: str) -> Letter:
        """Delete a letter; returns what it held."""
        letter = await self.show(job_id)
        if not await self._gateway.take(letter.routing_key, job_id):
            raise _unknown(job_id)
        return letter


def _unknown(job_id: str) -> ActorError:
    return ActorError(
        "InvalidInput",
        f"There is no dead letter with job id {job_id!r}; list them with 'akter dead-letters'.",
        code="unknown_dead_letter",
        field="job_id",
    )
