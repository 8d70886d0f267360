"""A job's dependencies: the clients and resources executors use, created once per runtime.

Declare a typed key per dependency, say how each is made, hand the registry to the runtime, and
reach them from an executor through its call::

    PAYMENTS = akter.Resource[PaymentsClient]("payments")

    resources = akter.Resources()


    @resources.setup(PAYMENTS)
    async def payments() -> AsyncIterator[PaymentsClient]:
        client = PaymentsClient(api_key=os.environ["PAYMENTS_KEY"])
        yield client  # set up when the runtime starts
        await client.aclose()  # torn down when it stops


    class Order(akter.Actor[State]):
        @akter.job(attempts=5)
        async def charge(call: akter.JobCall, req: Charge) -> str:
            return await call.resource(PAYMENTS).charge(req.amount, key=call.job_id)


    runtime = akter.Runtime([Order], resources=resources)

A test replaces one resource and keeps the others: ``ActorTest([Order], database_url=url,
resources=resources.override(PAYMENTS, FakeProvider()))``; the replaced setup never runs.

A :class:`Resources` is a declaration: each runtime started with it sets up its own instances
(in declaration order, after connecting and before any job attempt can start) and tears them
down in reverse order when it stops (after its attempts have ended). A value given with
:meth:`Resources.provide` is shared as is and never torn down: its owner closes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from akter.errors import ConfigurationError, JobFailure

T = TypeVar("T")

#: A setup function: an async generator that yields the resource once (pytest-fixture style).
Setup = Callable[[], AsyncIterator[T]]


class Resource(Generic[T]):
    """A typed key naming one dependency: ``Resource[PaymentsClient]("payments")``.

    Keys compare by identity: two keys with the same name are different resources (the name is
    for messages). Declare each key once, at module level, beside the code that uses it.

    Args:
        name: What the resource is, in error messages and logs.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"A resource needs a non-empty name, got {name!r}.")
        self.name = name

    def __repr__(self) -> str:
        return f"akter.Resource({self.name!r})"


class MissingResource(JobFailure):
    """An executor asked for a resource its runtime does not provide.

    A job failure that no provider can have applied (the lookup comes first): the attempt is
    retried under the job's ``attempts`` and backoff, on whichever runner claims it, and the
    job is dead-lettered with this message once they run out, never dropped. Fix the runtime's
    ``resources=`` and retry the dead letter.
    """

    def __init__(self, key: Resource[Any], where: str) -> None:
        super().__init__(
            f"{where} asked for resource {key.name!r}, which this runtime does not provide; "
            f"give the runtime resources= with a provide() or setup() for it."
        )
        self.key = key


class Resources:
    """The dependencies a runtime hands its executors (module docstring).

    Build it with :meth:`provide` (a ready value) and :meth:`setup` (an async generator run at
    start and finished at stop); :meth:`override` returns a copy with one of them replaced.
    """

    def __init__(self) -> None:
        self._made: dict[Resource[Any], tuple[str, Any]] = {}

    def provide(self, key: Resource[T], value: T) -> Resources:
        """Provide a ready value under ``key`` (shared as is, never torn down); returns self.

        Raises:
            ConfigurationError: If ``key`` is already provided.
        """
        self._add(key, ("value", value))
        return self

    def setup(self, key: Resource[T]) -> Callable[[Setup[T]], Setup[T]]:
        """Decorate an async generator that makes ``key``'s resource (module docstring).

        Code before its ``yield`` runs when the runtime starts, code after it when the runtime
        stops (also when a later resource's setup fails at start).

        Raises:
            ConfigurationError: If ``key`` is already provided.
        """

        def register(fn: Setup[T]) -> Setup[T]:
            self._add(key, ("setup", fn))
            return fn

        return register

    def override(self, key: Resource[T], value: T) -> Resources:
        """A copy with ``key`` provided by ``value`` instead (a test's fake); self is unchanged.

        Raises:
            ConfigurationError: If ``key`` is not provided here (a typo would test nothing).
        """
        if key not in self._made:
            raise ConfigurationError(
                f"Cannot override {key!r}: these resources do not provide it; use provide()."
            )
        copy = Resources()
        copy._made = {**self._made, key: ("value", value)}
        return copy

    def __contains__(self, key: object) -> bool:
        return key in self._made

    def _add(self, key: Resource[Any], made: tuple[str, Any]) -> None:
        if not isinstance(key, Resource):
            raise ConfigurationError(f"Resources are keyed by akter.Resource, not {key!r}.")
        if key in self._made:
            raise ConfigurationError(f"{key!r} is already provided; use override() to replace.")
        self._made[key] = made

    async def open(self, into: OpenResources) -> None:
        """Set up every resource in declaration order into ``into``; the caller closes it.

        If a setup fails, those already set up are torn down and the error propagates.
        """
        try:
            for key, (kind, made) in self._made.items():
                if kind == "value":
                    into.values[key] = made
                else:
                    manager = contextlib.asynccontextmanager(made)()
                    into.values[key] = await into.stack.enter_async_context(manager)
        except BaseException:
            await into.close()
            raise


class OpenResources:
    """One runtime's live resources: looked up by executors, closed when it stops."""

    def __init__(self) -> None:
        self.values: dict[Resource[Any], Any] = {}
        self.stack = contextlib.AsyncExitStack()

    def get(self, key: Resource[T], where: str) -> T:
        """The resource under ``key``.

        Raises:
            MissingResource: If this runtime does not provide it (``where`` names the asker).
        """
        try:
            value: T = self.values[key]
        except KeyError:
            raise MissingResource(key, where) from None
        return value

    async def close(self) -> None:
        """Tear the set-up resources down in reverse order (a later open starts afresh)."""
        self.values.clear()
        stack, self.stack = self.stack, contextlib.AsyncExitStack()
        await stack.aclose()
