"""Deciding what a claimed row means under this code (evolution E3): deliver, leave or park.

A claimed intent, timer, tick or job row is decoded with the shared rules of
:mod:`akter._members` (``decode_payload``: migrations, then validation). Three outcomes:

- :class:`Decoded`: the payload at the code's version, to deliver or execute;
- :class:`TooNew`: stored at a payload version above the code's: a newer runner may know it,
  so the claim is handed back without counting the attempt (E4, rolling deploys);
- :class:`Unusable`: the code cannot deliver it (unknown command or job, a payload that fails
  after its migrations): the row is parked with a cause naming every failing field.

The functions here are pure: the relay and the job executor write the outcome.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from akter._evolution import PayloadTooNew, upgrade_payload
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter._members import ActorDefinition
    from akter.jobs import Job


@dataclass(frozen=True)
class Decoded:
    """A payload this code delivers: the canonical command (or job) name and the payload."""

    name: str
    payload: dict[str, Any]
    version: int


@dataclass(frozen=True)
class TooNew:
    """Stored at a payload version above the code's: left due for a newer runner."""

    message: str


@dataclass(frozen=True)
class Unusable:
    """The code cannot deliver the row: it is parked with ``cause`` (every failing field)."""

    cause: str
    #: The command is not declared here (another runner's code may declare it: a deploy).
    unknown_command: bool = False


Outcome = Decoded | TooNew | Unusable

#: How long a released too-new row waits before any runner may claim it again: long enough
#: that an older runner does not spin on it, short next to a rolling deploy.
TOO_NEW_WAIT_MS = 1000


def decode_intent(definition: ActorDefinition, command: str, payload: str, version: int) -> Outcome:
    """A claimed intent's (or timer's, tick's) payload for ``definition.command``."""
    try:
        member = definition.member(command, "command")
    except ActorError as exc:
        return Unusable(
            f"UnknownCommand: {exc.message} Declare it, or add aliases=({command!r},) to the "
            "command that replaced it, then retry the parked row.",
            unknown_command=True,
        )
    what = f"{definition.name}.{member.name}"
    try:
        stored = json.loads(payload)
        body = member.decode_payload(stored, version)
    except PayloadTooNew as exc:
        return TooNew(str(exc))
    except ActorError as exc:
        fields = _failing_fields(member.args_model, member.payload_chain, stored, version, what)
        return Unusable(f"InvalidInput: {exc.message}{fields}")
    except ValueError as exc:  # the stored text is not JSON
        return Unusable(f"InvalidInput: the stored payload of {what} is not JSON ({exc}).")
    return Decoded(member.name, body, member.version)


def decode_job(job: Job[Any, Any], payload: str, version: int) -> Outcome:
    """A claimed job row's payload under ``job`` (found by name or alias)."""
    what = f"{job.owner.name if job.owner else ''}.{job.name}"
    try:
        stored = json.loads(payload)
        body = job.decode_payload(stored, version)
    except PayloadTooNew as exc:
        return TooNew(str(exc))
    except ActorError as exc:
        model = job.payload_model
        fields = _failing_fields(model, job.payload_chain, stored, version, what) if model else ""
        return Unusable(f"InvalidInput: {exc.message}{fields}")
    except ValueError as exc:
        return Unusable(f"InvalidInput: the stored payload of {what} is not JSON ({exc}).")
    return Decoded(job.name, body, job.version)


def _failing_fields(
    model: type[BaseModel], chain: Any, stored: Any, version: int, what: str
) -> str:
    """`` Failing fields: 'a' (Field required), 'b' (...).`` when there is more than one."""
    try:
        upgraded = upgrade_payload(chain, stored, version, what)
        model.model_validate(upgraded)
    except ValidationError as exc:
        found = [
            f"{'.'.join(str(p) for p in e['loc']) or 'value'!r} ({e['msg']})" for e in exc.errors()
        ]
        return f" Failing fields: {', '.join(found)}." if len(found) > 1 else ""
    except (ActorError, PayloadTooNew):
        return ""
    return ""


class OncePer:
    """Lets a message through once per key per ``every_s`` (log spam guard)."""

    def __init__(self, every_s: float) -> None:
        self._every = every_s
        self._last: dict[tuple[Any, ...], float] = {}

    def allow(self, *key: Any) -> bool:
        """Whether to log for ``key`` now (and remember that it was)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._every:
            return False
        self._last[key] = now
        return True


log = logging.getLogger("akter.parking")
