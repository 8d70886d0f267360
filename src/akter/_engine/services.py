"""What every background component of a runner receives: ``Services``, never the ``Runtime``.

The relay, the job executor, the runner registry, the progress hub, the event bus, retention,
sampling, the skew watch and the dead-letter operations each take a ``Services`` plus the explicit
callbacks they call back into (``deliver``, ``run_singleton_loop``, ...). ``Services`` holds:

- ``config``: the frozen, validated ``RuntimeConfig``;
- ``store`` and ``clock``: the database (built once per runner; bound to its URL at start);
- ``hooks`` (fault points) and ``metrics``;
- ``registry``: the hosted actor types and event tags, addressing and routing keys;
- ``supervisor``: the runner's lifecycle state (readiness, the fatal error) and ``supervise``;
- ``local``: the local monotonic clock of job attempts' lease deadlines (a manual one in tests);
- ``resources``: the runner's live job resources (``akter.Resources``, open while it runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from akter._config import RuntimeConfig
from akter._engine.dispatcher import routing_key_of
from akter._engine.hooks import Hooks
from akter._ids import validate_actor_id, validate_tenant
from akter._local_clock import LocalClock
from akter._store.pool import Clock, Store
from akter.actor import ActorDefinition, definition_of
from akter.callers import ActorRef
from akter.errors import ActorError, ConfigurationError, DefinitionError
from akter.resources import OpenResources

if TYPE_CHECKING:
    from akter.actor import Actor
    from akter.jobs import Job
    from akter.telemetry import Metrics

log = logging.getLogger("akter.runtime")

Readiness = Literal["starting", "ready", "draining", "drained", "storage", "unregistered", "failed"]


class Registry:
    """The actor types a runner hosts, their event tags, and addressing by type."""

    def __init__(self, actors: Sequence[type[Actor[Any]]]) -> None:
        self.definitions: dict[str, ActorDefinition] = {}
        for actor in actors:
            definition = definition_of(actor)
            if definition.name in self.definitions:
                raise DefinitionError(
                    f"Two actor classes are named {definition.name!r}; give one of them name=... ."
                )
            definition.resolve()
            self.definitions[definition.name] = definition
        #: Every declared event class by its tag, across the hosted types.
        #: Every declared event class by its tag and by its aliases (evolution E2).
        self.event_types: dict[str, type[Any]] = {}
        for definition in self.definitions.values():
            for event in definition.events:
                event.event_chain()  # a gap or a wrong version= is a DefinitionError now
                for tag in (event.event_tag, *event.event_aliases):
                    other = self.event_types.setdefault(tag, event)
                    if other is not event:
                        raise DefinitionError(
                            f"Event tag {tag!r} is used by {other.__qualname__!r} and "
                            f"{event.__qualname__!r}; give one of them tag=... or drop the "
                            "alias."
                        )

    def definition(self, actor: type[Actor[Any]] | str) -> ActorDefinition:
        """The definition of a hosted actor type (by class or name)."""
        name = actor if isinstance(actor, str) else definition_of(actor).name
        found = self.definitions.get(name)
        if found is None:
            raise ActorError(
                "InvalidInput",
                f"Actor type {name!r} is not registered with this runtime.",
                code="unknown_type",
            )
        return found

    def ref(
        self, actor: type[Actor[Any]] | str, id: str = "", *, tenant: str = "default"
    ) -> ActorRef:
        """Validate and build an actor address (a singleton has the id ``""``)."""
        from akter.callers import ActorRef

        definition = self.definition(actor)
        tenant = validate_tenant(tenant)
        if definition.singleton:
            if id != "":
                raise ActorError(
                    "InvalidInput",
                    f"{definition.name} is a singleton; get it without an id.",
                    field="id",
                )
        else:
            id = validate_actor_id(id)
        return ActorRef(tenant, definition.name, id)

    def routing_key(self, ref: ActorRef) -> int:
        """The routing key of an address under its type's placement."""
        return routing_key_of(self.definition(ref.type), ref)


@dataclass
class Supervisor:
    """A runner's lifecycle state, and the watch over its background tasks."""

    readiness: Readiness = "starting"
    started: bool = False
    stopping: bool = False
    #: Set when a supervised background task died: the runtime refuses further work.
    fatal: BaseException | None = None
    #: Called once when a supervised task dies (the runtime stops accepting commands).
    on_fatal: Callable[[], None] = field(default=lambda: None)

    def supervise(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """Watch a named background task: if it dies while the runtime runs, fail loudly."""

        def done(finished: asyncio.Task[Any]) -> None:
            if finished.cancelled() or self.stopping or not self.started:
                return
            error = finished.exception()
            self.fatal = error or RuntimeError(f"{finished.get_name()} returned unexpectedly")
            self.readiness = "failed"
            self.on_fatal()
            log.critical(
                "Background task stopped unexpectedly; the runtime has failed",
                exc_info=error,
                extra={"task": finished.get_name()},
            )

        task.add_done_callback(done)
        return task

    def require_started(self) -> None:
        """Refuse work on a runtime that is not started, or whose background work died."""
        if self.fatal is not None:
            raise ConfigurationError(
                f"The runtime failed: a background task died ({self.fatal!r}); restart it."
            )
        if not self.started:
            raise ConfigurationError("The runtime is not started; use 'async with runtime:'.")


@dataclass(eq=False)
class Services:
    """What a runner's components share (module docstring).

    ``config`` is replaced only before the runner starts (``Runtime.reconfigure``); components
    read it when they act, never copy the role options (relay, executes, ...) at construction.
    """

    config: RuntimeConfig
    store: Store
    clock: Clock
    hooks: Hooks
    metrics: Metrics
    registry: Registry
    supervisor: Supervisor
    #: The local monotonic clock job attempts measure their lease deadlines on.
    local: LocalClock = field(default_factory=LocalClock)
    #: The resources job executors reach through their call (set up at start, closed at stop).
    resources: OpenResources = field(default_factory=OpenResources)

    @property
    def definitions(self) -> Mapping[str, ActorDefinition]:
        """The hosted actor types by name."""
        return self.registry.definitions

    def executed_jobs(self) -> list[Job[Any, Any]]:
        """The declared jobs this runner executes (``config.executes``), in a stable order."""
        found: dict[tuple[str, str], Job[Any, Any]] = {}
        for definition in self.registry.definitions.values():
            for name, job in definition.jobs.items():
                found[(definition.name, name)] = job
        return [found[key] for key in sorted(self.config.executes) if key in found]
