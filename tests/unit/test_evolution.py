"""The declarations of evolution.md: chains, versions, aliases, decoding and the loss guard."""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

import akter
from akter._evolution import PayloadTooNew, StateDecodeError, lost_keys


class Named(BaseModel):
    first: str = ""
    last: str = ""


class V0(BaseModel):
    name: str = ""


def test_state_version_is_the_number_of_migrations() -> None:
    class Person(akter.Actor[Named]):
        @akter.migrate_state(from_version=0)
        def _split(old: dict[str, Any]) -> dict[str, Any]:
            first, _, last = old.pop("name", "").partition(" ")
            return {**old, "first": first, "last": last}

        @akter.migrate_state(from_version=1)
        def _strip(old: dict[str, Any]) -> dict[str, Any]:
            return {k: v.strip() for k, v in old.items()}

    d = akter.actor.definition_of(Person)
    assert d.state_version == 2
    _, dumped = d.decode_state({"name": "Ada  Lovelace "}, 0, "Person/'p'")
    assert dumped == {"first": "Ada", "last": "Lovelace"}
    assert d.decode_state({"first": "a", "last": "b"}, 2, "x")[1] == {"first": "a", "last": "b"}


def test_typed_migration_validates_its_input_and_dumps_its_output() -> None:
    class Person(akter.Actor[Named]):
        @akter.migrate_state(from_version=0)
        def _split(old: V0) -> Named:
            first, _, last = old.name.partition(" ")
            return Named(first=first, last=last)

    d = akter.actor.definition_of(Person)
    assert d.decode_state({"name": "Ada L"}, 0, "x")[1] == {"first": "Ada", "last": "L"}
    with pytest.raises(StateDecodeError) as info:
        d.decode_state({"name": 5}, 0, "Person/'p'")
    assert info.value.kind == "migration" and "V0" in info.value.message


@pytest.mark.parametrize("versions", [(1,), (0, 2), (0, 0)])
def test_migrations_must_be_contiguous_from_zero(versions: tuple[int, ...]) -> None:
    body: dict[str, Any] = {}
    for i, v in enumerate(versions):
        body[f"_m{i}"] = akter.migrate_state(from_version=v)(lambda old: old)
    with pytest.raises(akter.DefinitionError, match="migrations"):
        types.new_class("Gappy", (akter.Actor[Named],), {}, lambda ns: ns.update(body))


def test_a_migration_takes_one_argument_and_is_not_async() -> None:
    with pytest.raises(akter.DefinitionError, match="exactly one argument"):
        akter.migrate_state(from_version=0)(lambda a, b: a)  # type: ignore[arg-type,misc]

    async def coro(old: dict[str, Any]) -> dict[str, Any]:
        return old

    with pytest.raises(akter.DefinitionError, match="not async"):
        akter.migrate_state(from_version=0)(coro)  # type: ignore[arg-type]


def test_state_newer_than_the_code_is_too_new() -> None:
    class Person(akter.Actor[Named]):
        pass

    with pytest.raises(StateDecodeError) as info:
        akter.actor.definition_of(Person).decode_state({"first": "a"}, 1, "Person/'p'")
    assert info.value.kind == "too_new" and "state version 1" in info.value.message


def test_the_loss_guard_names_every_lost_key_path() -> None:
    class Inner(BaseModel):
        sku: str = ""

    class Cart(BaseModel):
        items: list[Inner] = []
        owner: str = ""

    class Shop(akter.Actor[Cart]):
        pass

    d = akter.actor.definition_of(Shop)
    stored = {"items": [{"sku": "a", "qty": 2}], "owner": "x", "name": "alice"}
    with pytest.raises(StateDecodeError) as info:
        d.decode_state(stored, 0, "Shop/'s'")
    assert info.value.kind == "lost"
    assert info.value.lost == ("items[0].qty", "name")
    assert "'name'" in info.value.message and "migrate_state" in info.value.message


def test_extra_allow_keeps_unknown_keys_and_passes_the_guard() -> None:
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        n: int = 0

    class Keeper(akter.Actor[Open]):
        pass

    _, dumped = akter.actor.definition_of(Keeper).decode_state({"n": 1, "old": 2}, 0, "x")
    assert dumped == {"n": 1, "old": 2}


JSON = st.recursive(
    st.integers() | st.text(max_size=3),
    lambda c: st.dictionaries(st.text(max_size=3), c, max_size=3) | st.lists(c, max_size=3),
    max_leaves=12,
)


@given(JSON)
def test_nothing_is_lost_between_a_value_and_itself(value: Any) -> None:
    assert lost_keys(value, value) == []


def test_lost_keys_reports_shortened_lists() -> None:
    assert lost_keys({"a": [1, 2, 3]}, {"a": [1]}) == ["a[1:]"]


def test_command_payload_versions_and_aliases() -> None:
    class Bank(akter.Actor[Named]):
        @akter.command(version=1, aliases=("credit",))
        async def deposit(self, cents: int, currency: str = "EUR") -> int:
            return cents

        @deposit.migrate_payload(from_version=0)
        def _cents(old: dict[str, Any]) -> dict[str, Any]:
            return {"cents": old["amount"] * 100}

    d = akter.actor.definition_of(Bank)
    member = d.member("credit")
    assert member.name == "deposit" and member.version == 1 and d.canonical("credit") == "deposit"
    assert member.decode_payload({"amount": 2}, 0) == {"cents": 200, "currency": "EUR"}
    assert member.decode_payload({"cents": 5}, 1) == {"cents": 5, "currency": "EUR"}
    with pytest.raises(PayloadTooNew):
        member.decode_payload({"cents": 5}, 2)
    with pytest.raises(akter.ActorError) as info:
        member.decode_payload({"amount": "x" * 0 or None}, 0)
    assert info.value.reason == "InvalidInput"


def test_a_version_without_its_migrations_is_a_definition_error() -> None:
    with pytest.raises(akter.DefinitionError, match="version=2 needs migrations"):

        class Bank(akter.Actor[Named]):
            @akter.command(version=2)
            async def deposit(self, cents: int) -> int:
                return cents

            @deposit.migrate_payload(from_version=0)
            def _cents(old: dict[str, Any]) -> dict[str, Any]:
                return old


def test_an_alias_must_not_collide_with_another_member() -> None:
    with pytest.raises(akter.DefinitionError, match="alias 'close'"):

        class Door(akter.Actor[Named]):
            @akter.command(aliases=("close",))
            async def shut(self) -> None:
                return None

            @akter.command
            async def close(self) -> None:
                return None

    with pytest.raises(akter.DefinitionError, match="claimed by both"):

        class Gate(akter.Actor[Named]):
            @akter.command(aliases=("old",))
            async def a(self) -> None:
                return None

            @akter.command(aliases=("old",))
            async def b(self) -> None:
                return None


class Charge(BaseModel):
    cents: int


def test_job_versions_and_aliases() -> None:
    class Till(akter.Actor[Named]):
        @akter.job(version=1, aliases=("pay",))
        async def charge(call: akter.JobCall, payload: Charge) -> None:
            return None

        @charge.migrate_payload(from_version=0)
        def _v0(old: dict[str, Any]) -> dict[str, Any]:
            return {"cents": old["amount"]}

    d = akter.actor.definition_of(Till)
    d.resolve()
    job = d.job("pay")
    assert job is not None and job.name == "charge" and job.version == 1
    assert job.decode_payload({"amount": 3}, 0) == {"cents": 3}


def test_event_versions_and_aliases() -> None:
    class Credited(
        akter.Event, version=1, aliases=("evo-test.Deposited",), tag="evo-test.Credited"
    ):
        cents: int

    @Credited.migrate(from_version=0)
    def _v0(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"]}

    assert Credited.decode({"amount": 4}, 0) == Credited(cents=4)
    assert Credited.decode({"cents": 4}, 1) == Credited(cents=4)
    assert akter.Event.registry()["evo-test.Deposited"] is Credited
