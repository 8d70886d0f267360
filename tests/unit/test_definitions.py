"""Definition-time validation (semantics §1.1, §5.1, conformance JB-27) and declared errors.

Every invalid declaration fails when the class (or the ``Runtime``) is built, with a
``DefinitionError`` that names what is wrong — long before anything touches a database.
"""

from __future__ import annotations

import types
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, model_validator

import akter
from akter.actor import definition_of
from akter.errors import UnknownDeclaredError


class Counter(BaseModel):
    n: int = 0


class Charge(BaseModel):
    cents: int


class Opaque:
    """A plain class: pydantic has no schema for it."""


def _actor(**options: Any) -> type[akter.Actor[Counter]]:
    """Declare a small valid actor with the given class keywords."""

    class Declared(akter.Actor[Counter], **options):
        @akter.command
        async def add(self, by: int) -> int:
            self.state.n += by
            return self.state.n

    return Declared


def _declare(name: str, members: dict[str, Any]) -> type:
    """Declare an actor class whose members have names a class body cannot spell."""
    return types.new_class(name, (akter.Actor[Counter],), {}, lambda ns: ns.update(members))


def _job(**options: Any) -> akter.Job[Charge, str]:
    async def charge(call: akter.JobCall, req: Charge) -> str:
        return call.job_id

    return akter.job(**options)(charge)


# --- actor type names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1bad", "A" * 65, "bad-name", "Café", "_x", "a b", "a\n"])
def test_invalid_type_name(name: str) -> None:
    with pytest.raises(akter.DefinitionError, match=r"Actor type name .* is invalid"):
        _actor(name=name)


@pytest.mark.parametrize("name", ["A", "A" * 64, "order_v2", "Z9_"])
def test_valid_type_name(name: str) -> None:
    assert definition_of(_actor(name=name)).name == name


def test_type_name_defaults_to_the_class_name() -> None:
    class Order(akter.Actor[Counter]):
        pass

    assert definition_of(Order).name == "Order"


def test_duplicate_type_names_in_one_runtime() -> None:
    first, second = _actor(name="X"), _actor(name="X")
    with pytest.raises(akter.DefinitionError, match=r"Two actor classes are named 'X'"):
        akter.Runtime([first, second])
    akter.Runtime([first, _actor(name="Y")])  # distinct names are fine


def test_runtime_refuses_a_class_that_is_not_an_actor() -> None:
    with pytest.raises(akter.DefinitionError, match=r"is not an akter\.Actor subclass"):
        akter.Runtime([Counter])  # type: ignore[list-item]


# --- member names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "member",
    ["send", "state", "id", "emit", "later", "with_command_id", "broadcast", "broadcasts", "watch"],
)
def test_reserved_member_names(member: str) -> None:
    async def handler(self: Any) -> None:
        return None

    with pytest.raises(akter.DefinitionError, match=rf"'{member}' is reserved"):
        _declare("Reserved", {member: akter.command(handler)})


def test_reserved_name_for_a_query() -> None:
    with pytest.raises(akter.DefinitionError, match=r"'state' is reserved .* rename the query"):

        class Reserved(akter.Actor[Counter]):
            @akter.query
            async def state(self) -> int:  # type: ignore[override]
                return 0


def test_member_names_must_not_start_with_an_underscore() -> None:
    with pytest.raises(akter.DefinitionError, match=r"must not start with '_'"):

        class Hidden(akter.Actor[Counter]):
            @akter.command
            async def _secret(self) -> None:
                return None


def test_job_names_are_members_too() -> None:
    with pytest.raises(akter.DefinitionError, match=r"'send' is reserved .* rename the job"):

        class Jobs(akter.Actor[Counter]):
            send = _job()  # type: ignore[assignment]


# --- command signatures ------------------------------------------------------------------------


def test_command_parameter_without_annotation() -> None:
    with pytest.raises(akter.DefinitionError, match=r"parameter 'by' needs a type annotation"):

        class Untyped(akter.Actor[Counter]):
            @akter.command
            async def add(self, by) -> None:  # type: ignore[no-untyped-def]
                return None


def test_command_without_return_annotation() -> None:
    with pytest.raises(akter.DefinitionError, match=r"return type needs an annotation"):

        class NoReturn(akter.Actor[Counter]):
            @akter.command
            async def add(self, by: int):  # type: ignore[no-untyped-def]
                return None


def test_sync_command() -> None:
    with pytest.raises(akter.DefinitionError, match=r"@command 'add' must be 'async def'"):

        class Sync(akter.Actor[Counter]):
            @akter.command  # type: ignore[arg-type]
            def add(self, by: int) -> None:
                return None


def test_sync_query() -> None:
    with pytest.raises(akter.DefinitionError, match=r"@query 'total' must be 'async def'"):

        class Sync(akter.Actor[Counter]):
            @akter.query  # type: ignore[type-var]
            def total(self) -> int:
                return 0


@pytest.mark.parametrize("variadic", ["*args: int", "**kwargs: int", "by: int, *rest: int"])
def test_variadic_command(variadic: str) -> None:
    source = f"async def add(self, {variadic}) -> None:\n    return None\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(akter.DefinitionError, match=r"\*args and \*\*kwargs are not supported"):
        _declare("Variadic", {"add": akter.command(namespace["add"])})


def test_command_parameter_starting_with_an_underscore() -> None:
    with pytest.raises(akter.DefinitionError, match=r"parameter '_by' must not start with '_'"):

        class Private(akter.Actor[Counter]):
            @akter.command
            async def add(self, _by: int) -> None:
                return None


def test_unsupported_annotation() -> None:
    with pytest.raises(akter.DefinitionError, match=r"Unsupportive.add: unsupported annotation"):

        class Unsupportive(akter.Actor[Counter]):
            @akter.command
            async def add(self, by: Opaque) -> None:
                return None


def test_errors_must_be_declared_error_classes() -> None:
    with pytest.raises(akter.DefinitionError, match=r"errors= takes DeclaredError subclasses"):
        akter.command(errors=(ValueError,))  # type: ignore[arg-type]


# --- state type and class keywords -------------------------------------------------------------


def test_state_type_must_be_a_pydantic_model() -> None:
    with pytest.raises(akter.DefinitionError, match=r"the state type .*int.* must be a pydantic"):

        class Bad(akter.Actor[int]):  # type: ignore[type-var]
            pass


def test_actor_without_state_has_an_empty_state() -> None:
    class Stateless(akter.Actor[akter.EmptyState]):
        pass

    class Inherits(Stateless):
        pass

    assert definition_of(Stateless).state_model is akter.EmptyState
    assert definition_of(Inherits).state_model is akter.EmptyState


def test_unknown_class_keyword() -> None:
    with pytest.raises(akter.DefinitionError, match=r"unknown class keyword\(s\) \['colour'\]"):
        _actor(colour="red")


def test_invalid_placement() -> None:
    with pytest.raises(akter.DefinitionError, match=r"placement must be 'tenant' or 'actor'"):
        _actor(placement="region")


def test_access_must_be_callable() -> None:
    with pytest.raises(akter.DefinitionError, match=r"access= must be callable"):
        _actor(access="public")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("execution_timeout", 0),
        ("execution_timeout", timedelta(0)),
        ("lock_wait", 0.0),
        ("delivery_timeout", 2**31 / 1000),
        ("keep_events", timedelta(microseconds=0)),
        ("hibernate_after", 0),
    ],
)
def test_invalid_policy_duration(option: str, value: float | timedelta) -> None:
    with pytest.raises(akter.DefinitionError, match=rf"Declared: {option} must be between"):
        _actor(**{option: value})


@pytest.mark.parametrize("option", ["lock_wait", "keep_receipts", "max_schedule_lag"])
def test_negative_policy_duration(option: str) -> None:
    with pytest.raises(akter.DefinitionError, match=rf"Declared: The {option} -1 must not be neg"):
        _actor(**{option: -1})


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_invalid_max_state_bytes(value: object) -> None:
    with pytest.raises(akter.DefinitionError, match=r"max_state_bytes must be an integer"):
        _actor(max_state_bytes=value)


def test_policy_object_and_keywords_combine() -> None:
    actor = _actor(policy=akter.Policy(lock_wait=0.5), execution_timeout=timedelta(seconds=5))
    policy = definition_of(actor).policy
    assert (policy.lock_wait, policy.execution_timeout) == (500, 5000)
    assert policy.delivery_timeout == 30_000
    with pytest.raises(akter.DefinitionError, match=r"lock_wait must be between"):
        _actor(policy=akter.Policy(lock_wait=0))


# --- job options (JB-27) -----------------------------------------------------------------------


@pytest.mark.parametrize("per_actor", [0, 65, 1.5, -1, True])
def test_job_per_actor_bounds(per_actor: Any) -> None:
    with pytest.raises(akter.DefinitionError, match=r"per_actor must be an integer from 1 to 64"):
        _job(per_actor=per_actor)


@pytest.mark.parametrize("attempts", [0, 102, 2.0, False])
def test_job_attempts_bounds(attempts: Any) -> None:
    with pytest.raises(akter.DefinitionError, match=r"attempts must be an integer from 1 to 101"):
        _job(attempts=attempts)


@pytest.mark.parametrize(
    ("backoff", "message"),
    [
        ((2.0, 1.0), r"backoff max \(1000 ms\) must be at least its base \(2000 ms\)"),
        ((0, 1.0), r"backoff base must be between 1 ms"),
        ((1.0, 2**31 / 1000), r"backoff max must be between"),
        ((1.0,), r"backoff must be a \(base, max\) pair"),
    ],
)
def test_job_backoff_bounds(backoff: Any, message: str) -> None:
    with pytest.raises(akter.DefinitionError, match=message):
        _job(backoff=backoff)


@pytest.mark.parametrize("timeout", [0, 2**31 / 1000, timedelta(milliseconds=2**31)])
def test_job_timeout_bounds(timeout: float | timedelta) -> None:
    with pytest.raises(akter.DefinitionError, match=r"timeout must be between 1 ms and"):
        _job(timeout=timeout)
    with pytest.raises(akter.DefinitionError, match=r"The timeout -1 must not be negative"):
        _job(timeout=-1)


def test_job_option_limits_are_inclusive() -> None:
    options = _job(
        attempts=101,
        per_actor=64,
        backoff=(0.001, (2**31 - 1) / 1000),
        timeout=timedelta(milliseconds=2**31 - 1),
    ).options
    assert (options.attempts, options.per_actor) == (101, 64)
    assert (options.backoff_base_ms, options.backoff_max_ms) == (1, 2**31 - 1)
    assert options.timeout_ms == 2**31 - 1
    assert _job(attempts=1, per_actor=1, backoff=(1, 1)).options.backoff_max_ms == 1000


def test_job_progress_bounds() -> None:
    with pytest.raises(akter.DefinitionError, match=r"progress_every must be between 50 ms"):
        _job(progress_every=0.01)
    with pytest.raises(akter.DefinitionError, match=r"progress_every must be at most 60 s"):
        _job(progress_every=61)
    with pytest.raises(akter.DefinitionError, match=r"progress= must be a pydantic model"):
        _job(progress=dict)


def test_job_payload_must_be_a_model() -> None:
    async def charge(call: akter.JobCall, cents: int) -> str:
        return call.job_id

    with pytest.raises(akter.DefinitionError, match=r"payload must be annotated with a pydantic"):

        class Payer(akter.Actor[Counter]):
            pay = akter.job()(charge)  # type: ignore[type-var]


def test_job_route_declared_on_another_actor_class() -> None:
    class Payer(akter.Actor[Counter]):
        @akter.job()
        async def charge(call: akter.JobCall, req: Charge) -> str:
            return call.job_id

    with pytest.raises(akter.DefinitionError, match=r"route .* must be a method of"):

        class Thief(akter.Actor[Counter]):
            @Payer.charge.on_success
            async def charged(self, charge_id: str) -> None:
                return None


def test_job_route_outside_the_job_owner() -> None:
    charge = _job()

    @charge.on_success
    async def charged(self: akter.Actor[Counter], charge_id: str) -> None:
        return None

    with pytest.raises(akter.DefinitionError, match=r"on_success route .* must be a method of"):

        class Payer(akter.Actor[Counter]):
            pay = charge


def test_two_success_routes_on_one_job() -> None:
    with pytest.raises(akter.DefinitionError, match=r"Job 'charge' already has an on_success"):

        class Payer(akter.Actor[Counter]):
            @akter.job()
            async def charge(call: akter.JobCall, req: Charge) -> str:
                return call.job_id

            @charge.on_success
            async def charged(self, charge_id: str) -> None:
                return None

            @charge.on_success
            async def charged_again(self, charge_id: str) -> None:
                return None


def test_sync_route() -> None:
    charge = _job()
    with pytest.raises(akter.DefinitionError, match=r"Route 'charged' must be 'async def'"):

        @charge.on_success  # type: ignore[arg-type]
        def charged(self: akter.Actor[Counter], charge_id: str) -> None:
            return None


def test_routes_are_internal_commands() -> None:
    class Payer(akter.Actor[Counter]):
        @akter.job(attempts=2)
        async def charge(call: akter.JobCall, req: Charge) -> str:
            return call.job_id

        @charge.on_success
        async def charged(self, charge_id: str) -> None:
            return None

        @charge.on_dead_letter
        async def failed(self, letter: akter.DeadLetter[Charge]) -> None:
            return None

    definition = definition_of(Payer)
    assert Payer.charge.owner is definition
    assert set(Payer.charge.routes) == {"success", "dead_letter"}
    assert definition.members["charged"].internal
    assert definition.members["failed"].internal
    assert definition.members["charged"].kind == "command"


# --- declared errors ---------------------------------------------------------------------------


class OutOfStock(akter.DeclaredError):
    sku: str
    left: int = 0


class OverLimit(akter.DeclaredError):
    sku: str
    left: int = 0


class Renamed(akter.DeclaredError, tag="test-definitions.renamed"):
    reason: str


def test_declared_error_fields_are_validated() -> None:
    error = OutOfStock(sku="A-1", left="3")
    assert (error.sku, error.left) == ("A-1", 3)
    assert error.fields == {"sku": "A-1", "left": 3}
    assert isinstance(error, akter.AkterError)
    with pytest.raises(ValidationError, match="sku"):
        OutOfStock(left=1)
    with pytest.raises(ValidationError, match="sku"):
        OutOfStock(sku=12)
    with pytest.raises(ValidationError, match="colour"):
        OutOfStock(sku="A-1", colour="red")


def test_declared_error_equality_by_class_and_fields() -> None:
    assert OutOfStock(sku="A-1") == OutOfStock(sku="A-1", left=0)
    assert hash(OutOfStock(sku="A-1")) == hash(OutOfStock(sku="A-1", left=0))
    assert OutOfStock("one message", sku="A-1") == OutOfStock("another", sku="A-1")
    assert OutOfStock(sku="A-1") != OutOfStock(sku="A-2")
    assert OutOfStock(sku="A-1") != OverLimit(sku="A-1")
    assert OutOfStock(sku="A-1") != ValueError("A-1")


def test_declared_error_round_trips_through_a_receipt() -> None:
    error = OutOfStock("only 2 left", sku="A-1", left=2)
    assert OutOfStock.tag == "OutOfStock"
    replayed = akter.DeclaredError.from_receipt(error.tag, error.fields, str(error))
    assert type(replayed) is OutOfStock
    assert replayed == error
    assert str(replayed) == "only 2 left"
    assert replayed.left == 2
    default = OutOfStock(sku="B")
    assert str(default) == "OutOfStock({'sku': 'B', 'left': 0})"
    assert akter.DeclaredError.from_receipt(default.tag, default.fields, None) == default


def test_declared_error_tag_override() -> None:
    assert Renamed.tag == "test-definitions.renamed"
    replayed = akter.DeclaredError.from_receipt(Renamed.tag, {"reason": "late"}, None)
    assert type(replayed) is Renamed
    assert replayed == Renamed(reason="late")


def test_unknown_declared_error_tag_replays_as_unknown() -> None:
    replayed = akter.DeclaredError.from_receipt("test-definitions.gone", {"x": 1}, "it failed")
    assert isinstance(replayed, UnknownDeclaredError)
    assert (replayed.stored_tag, replayed.stored) == ("test-definitions.gone", {"x": 1})
    assert str(replayed) == "it failed"


def test_duplicate_declared_error_tag() -> None:
    class First(akter.DeclaredError, tag="test-definitions.duplicate"):
        pass

    with pytest.raises(akter.DefinitionError, match=r"tag 'test-definitions.duplicate' is used"):

        class Second(akter.DeclaredError, tag="test-definitions.duplicate"):
            pass

    # The first declaration keeps the tag.
    assert type(akter.DeclaredError.from_receipt(First.tag, {}, None)) is First


def test_event_tag_defaults_to_the_class_name() -> None:
    class Paid(akter.Event):
        charge_id: str

    class Refunded(akter.Event, tag="refunded.v1"):
        charge_id: str

    assert (Paid.event_tag, Refunded.event_tag) == ("Paid", "refunded.v1")


# --- state models (evolution E1) ----------------------------------------------------------------


class _Required(BaseModel):
    owner: str
    n: int = 0


class _BadDefault(BaseModel):
    n: int = 0

    @model_validator(mode="after")
    def _positive(self) -> _BadDefault:
        if self.n <= 0:
            raise ValueError("n must be positive")
        return self


def test_h5_state_model_with_a_required_field_is_a_definition_error() -> None:
    # A new actor starts from State(): a required field used to fail every cold command with a
    # retryable ActorUnavailable and every query with a raw ValidationError.
    with pytest.raises(akter.DefinitionError, match=r"required field\(s\) 'owner'"):

        class Owned(akter.Actor[_Required]):
            @akter.command
            async def touch(self) -> None:
                return None

    with pytest.raises(akter.DefinitionError, match="default state _BadDefault"):

        class Positive(akter.Actor[_BadDefault]):
            pass

    class Fine(akter.Actor[Counter]):
        pass

    assert definition_of(Fine).default_state() == Counter()
