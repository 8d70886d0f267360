"""Orphans: stored names that no definition or alias claims (evolution E2).

Every runtime records at start the names it declares — actor types (the deployment's
placements), and per type its commands, jobs and declared event tags — in the deployment's
registry of names (``deployment_names``, a union over every deployment). The check compares that
registry with this runtime's definitions, so it never scans the data for distinct names:

- an **actor type** is an orphan when no definition here and no live runner hosts it;
- a **command** or **job** of a type hosted here, when no command (or job) of the type has that
  name or lists it in ``aliases=``;
- an **event tag** of a type hosted here that declares ``events=[...]``, when none of them has
  that tag or alias. (A type without ``events=`` records no tags: the tags it emits are not
  known at start. Tags stored before migration 0005 are not recorded either; ``akter check``
  finds both.)

Only candidates with rows are orphans. Their rows are counted by name only, each count capped at
:data:`COUNT_CAP`: actors, pending outbox rows (parked ones included), dead letters and events of
an orphan type; pending intents of an orphan command; job rows and dead letters of an orphan
job; events of an orphan tag. Each orphan is logged as one warning naming it, its counts and
the likely fix (``name=`` or ``aliases=``), again at most once per :data:`WARN_EVERY_S` per
runner. The check runs when a runner starts (a log only) and in every ``$maintenance`` cycle,
where the owner also sets the gauge ``akter.orphans`` by kind and forgets recorded member names
whose rows are all gone (a runner that declares one records it again at its next start; a
name found empty is counted again after :data:`EMPTY_RECHECK_S`). Orphans never change
readiness: the rows are kept, and the fix is a deploy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from akter._store.gateway.names import Counts, Name, NamesGateway

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter.actor import ActorDefinition

log = logging.getLogger("akter.orphans")

OrphanKind = Literal["actor_type", "command", "job", "event"]
#: The gauge's kinds, always all reported (0 when none).
KINDS: tuple[OrphanKind, ...] = ("actor_type", "command", "job", "event")
#: The most rows one count reads (the warning then says "at least").
COUNT_CAP = 10_000
#: One warning per orphan per runner at most this often.
WARN_EVERY_S = 3_600.0
#: A candidate found without rows is counted again after this long.
EMPTY_RECHECK_S = 3_600.0


@dataclass(frozen=True)
class Orphan:
    """A stored name no definition or alias claims, with the rows stored under it."""

    kind: OrphanKind
    actor_type: str
    #: The command, job or event tag (the type's own name for an ``actor_type``).
    name: str
    counts: Mapping[str, int]

    @property
    def fix(self) -> str:
        """The likely fix, for the warning."""
        if self.kind == "actor_type":
            return (
                f"declare the renamed class with name={self.actor_type!r} (its stored type "
                "name), or host the type on a runner again"
            )
        if self.kind == "event":
            return (
                f"add aliases=({self.name!r},) to the event class of {self.actor_type} that "
                "replaced it"
            )
        decorator = "@akter.command" if self.kind == "command" else "@akter.job"
        return (
            f"add aliases=({self.name!r},) to the {decorator} of {self.actor_type} that replaced it"
        )


def declared_names(definitions: Iterable[ActorDefinition]) -> list[Name]:
    """The ``(type, kind, name)`` commands, jobs and declared event tags to record at start."""
    names: list[Name] = []
    for d in definitions:
        names += [(d.name, "command", m.name) for m in d.members.values() if m.kind == "command"]
        names += [(d.name, "job", job) for job in d.jobs]
        names += [(d.name, "event", event.event_tag) for event in d.events]
    return sorted(set(names))


def claims(definition: ActorDefinition, kind: str, name: str) -> bool:
    """Whether the definition claims a recorded member name of ``kind`` (name or alias)."""
    if kind == "command":
        member = definition.members.get(definition.canonical(name))
        return member is not None and member.kind == "command"
    if kind == "job":
        return definition.job(name) is not None
    if kind == "event":
        if not definition.events:
            return True  # any event class may be emitted: nothing was recorded to judge by
        return any(name == e.event_tag or name in e.event_aliases for e in definition.events)
    return True  # a kind this code does not know is not its to judge


def unclaimed(
    recorded: Iterable[Name],
    definitions: Mapping[str, ActorDefinition],
    live_types: Iterable[str],
) -> list[Name]:
    """The recorded names this runtime's definitions and the live runners leave unclaimed.

    Members of a type this runtime does not host are judged by the runner hosting it (or, with
    none, through their type).
    """
    hosted_elsewhere = set(live_types)
    found: list[Name] = []
    for actor_type, kind, name in recorded:
        definition = definitions.get(actor_type)
        if kind == "actor_type":
            if definition is None and actor_type not in hosted_elsewhere:
                found.append((actor_type, kind, name))
        elif definition is not None and not claims(definition, kind, name):
            found.append((actor_type, kind, name))
    return found


class Orphans:
    """The orphan check of one runner (module docstring)."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._gateway = NamesGateway(services.store)
        self._warned: dict[Name, float] = {}
        self._empty_until: dict[Name, float] = {}
        #: How many checks this runner has completed (tests wait on it).
        self.checks = 0
        self._checked = asyncio.Event()

    async def check(self, live_types: Iterable[str], *, owner: bool) -> list[Orphan]:
        """Compare the registry with the code, count candidates' rows, warn; the orphans.

        Args:
            live_types: The actor types live runners host (their registrations).
            owner: This runner owns ``$maintenance``: it sets the gauge and forgets names
                whose rows are gone.
        """
        now = time.monotonic()
        recorded = await self._gateway.recorded()
        candidates = [
            n
            for n in unclaimed(recorded, self._services.registry.definitions, live_types)
            if self._empty_until.get(n, 0.0) <= now
        ]
        counts = await self._count(candidates)
        orphans: list[Orphan] = []
        empty: list[Name] = []
        for name in candidates:
            found = counts.get(name, {})
            if any(found.values()):
                orphans.append(Orphan(_kind(name[1]), name[0], name[2], found))
            else:
                empty.append(name)
                self._empty_until[name] = now + EMPTY_RECHECK_S
        for orphan in orphans:
            self._warn(orphan, now)
        if owner:
            await self._gateway.forget([n for n in empty if n[1] != "actor_type"])
            per_kind = dict.fromkeys(KINDS, 0)
            for orphan in orphans:
                per_kind[orphan.kind] += 1
            self._services.metrics.replace(
                "akter.orphans", (({"kind": k}, float(v)) for k, v in per_kind.items())
            )
        self.checks += 1
        self._checked.set()
        self._checked = asyncio.Event()
        return orphans

    async def wait_for(self, checks: int) -> None:
        """Wait until this runner has completed ``checks`` checks (tests)."""
        while self.checks < checks:
            await self._checked.wait()

    async def _count(self, candidates: Sequence[Name]) -> dict[Name, Counts]:
        gateway, cap = self._gateway, COUNT_CAP
        counts: dict[Name, Counts] = {}
        types = [n[0] for n in candidates if n[1] == "actor_type"]
        for actor_type, found in (await gateway.count_types(types, cap=cap)).items():
            counts[(actor_type, "actor_type", actor_type)] = found
        for kind in ("command", "job", "event"):
            pairs = [(n[0], n[2]) for n in candidates if n[1] == kind]
            members = await gateway.count_members(kind, pairs, cap=cap)
            for (actor_type, name), found in members.items():
                counts[(actor_type, kind, name)] = found
        return counts

    def _warn(self, orphan: Orphan, now: float) -> None:
        key = (orphan.actor_type, orphan.kind, orphan.name)
        if now < self._warned.get(key, float("-inf")) + WARN_EVERY_S:
            return
        self._warned[key] = now
        what = (
            f"actor type {orphan.actor_type!r}"
            if orphan.kind == "actor_type"
            else f"{orphan.kind} {orphan.name!r} of {orphan.actor_type}"
        )
        rows = ", ".join(f"{n} {table}" for table, n in orphan.counts.items())
        log.warning(
            "Stored rows carry a name that no definition or alias claims: %s (%srows: %s); "
            "they are kept, and nothing delivers or decodes them until a deploy claims the "
            "name: %s",
            what,
            "at least " if any(n >= COUNT_CAP for n in orphan.counts.values()) else "",
            rows,
            orphan.fix,
            extra={
                "orphan_kind": orphan.kind,
                "actor_type": orphan.actor_type,
                "member": None if orphan.kind == "actor_type" else orphan.name,
                "rows": dict(orphan.counts),
                "capped_at": COUNT_CAP,
                "fix": orphan.fix,
            },
        )


def _kind(kind: str) -> OrphanKind:
    assert kind in KINDS
    return kind
