"""Stable names without a database (evolution E2).

Receipts across aliases, alias collisions, event decoding of stored rows, and the orphan
comparison of recorded names with the code.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._engine.orphans import Orphan, claims, declared_names, unclaimed
from akter._engine.services import Registry
from akter._engine.turn import rules
from akter._engine.turn.types import Request, Result
from akter._event_decl import decode_stored
from akter._ids import CommandId
from akter.actor import ActorDefinition, definition_of
from akter.callers import ActorRef, User
from akter.errors import ActorError

NOW = 1_700_000_000_000


class Count(BaseModel):
    n: int = 0


class Renamed(akter.Event, tag="names-unit.Renamed", aliases=("names-unit.Old",)):
    n: int


class Ledger(akter.Actor[Count], name="NamesLedger", events=[Renamed]):
    @akter.command(aliases=("add_old",))
    async def add(self, by: int) -> int:
        return by

    @akter.command
    async def reset(self) -> None:
        return None

    @akter.query
    async def total(self) -> int:
        return 0

    @akter.job(aliases=("settle_old",))
    async def settle(call: akter.JobCall, payload: Count) -> None:
        return None


LEDGER = definition_of(Ledger)
_LOOP = asyncio.new_event_loop()


def _request(command: str, *, external: bool = True, payload_hash: str = "h1") -> Request:
    raw = f"v1.{NOW - 1000}.{NOW + 86_400_000}.{uuid.uuid4()}"
    return Request(
        member=LEDGER.member(command),
        ref=ActorRef("t1", LEDGER.name, "a-1"),
        payload={},
        payload_hash=payload_hash,
        command_id=CommandId(raw, NOW - 1000, NOW + 86_400_000),
        caller=User("alice"),
        external=external,
        future=_LOOP.create_future(),
    )


def _stored(request: Request, **changes: Any) -> dict[str, Any]:
    stored = {
        "command_id": request.command_id.raw,
        "caller_key": request.caller_key,
        "command": request.member.name,
        "payload_hash": request.payload_hash,
        "outcome": {"ok": 3},
    }
    return {request.command_id.raw: {**stored, **changes}}


def _decide(request: Request, receipts: dict[str, Any]) -> Result | None:
    return rules.decide(request, LEDGER, request.ref, NOW, receipts, True, 0)


def _reason(result: Result | None) -> str:
    assert result is not None and isinstance(result.error, ActorError)
    return result.error.reason


# --- receipts compare canonical names ---------------------------------------------------------


@pytest.mark.parametrize("external", [True, False])
def test_a_receipt_under_an_alias_replays_for_the_renamed_command(external: bool) -> None:
    request = _request("add", external=external)
    result = _decide(request, _stored(request, command="add_old"))
    assert result == Result("ok", value=3, replayed=True)


@pytest.mark.parametrize("stored_command", ["reset", "settle_old", "total", "gone"])
def test_a_receipt_of_another_command_is_a_conflict_whatever_its_name(stored_command: str) -> None:
    for external in (True, False):
        request = _request("add", external=external)
        result = _decide(request, _stored(request, command=stored_command))
        assert _reason(result) == "CommandConflict"


def test_an_external_call_with_another_payload_conflicts_across_the_alias() -> None:
    request = _request("add", payload_hash="h2")
    result = _decide(request, _stored(request, command="add_old", payload_hash="h1"))
    assert _reason(result) == "CommandConflict"


def test_an_internal_redelivery_replays_whatever_its_payload_now_hashes_to() -> None:
    # The row's own id, one stored payload: a migration since the first delivery changed the
    # hash, not the call.
    request = _request("add", external=False, payload_hash="after-migration")
    result = _decide(request, _stored(request, command="add_old", payload_hash="before"))
    assert result == Result("ok", value=3, replayed=True)


def test_another_callers_receipt_is_still_refused_across_the_alias() -> None:
    request = _request("add")
    result = _decide(request, _stored(request, command="add_old", caller_key="user:mallory"))
    assert _reason(result) == "Unauthorized"


# --- alias collisions ---------------------------------------------------------------------------


def test_a_command_alias_that_is_a_job_or_query_name_is_a_definition_error() -> None:
    with pytest.raises(akter.DefinitionError, match="alias 'settle' is the name of a job"):

        class A(akter.Actor[Count], name="NamesA"):
            @akter.command(aliases=("settle",))
            async def add(self) -> None:
                return None

            @akter.job()
            async def settle(call: akter.JobCall, payload: Count) -> None:
                return None

    with pytest.raises(akter.DefinitionError, match="alias 'total' is the name of a member"):

        class B(akter.Actor[Count], name="NamesB"):
            @akter.command(aliases=("total",))
            async def add(self) -> None:
                return None

            @akter.query
            async def total(self) -> int:
                return 0


def test_a_job_alias_that_is_a_command_name_or_another_alias_is_a_definition_error() -> None:
    with pytest.raises(akter.DefinitionError, match="alias 'add'"):

        class C(akter.Actor[Count], name="NamesC"):
            @akter.command
            async def add(self) -> None:
                return None

            @akter.job(aliases=("add",))
            async def settle(call: akter.JobCall, payload: Count) -> None:
                return None

    with pytest.raises(akter.DefinitionError, match="claimed by both"):

        class D(akter.Actor[Count], name="NamesD"):
            @akter.command(aliases=("old",))
            async def add(self) -> None:
                return None

            @akter.job(aliases=("old",))
            async def settle(call: akter.JobCall, payload: Count) -> None:
                return None


def test_an_alias_equal_to_another_types_member_is_fine() -> None:
    class E(akter.Actor[Count], name="NamesE"):
        @akter.command(aliases=("reset",))  # Ledger.reset: another type's member
        async def clear(self) -> None:
            return None

    registry = Registry([Ledger, E])
    assert registry.definition("NamesE").member("reset").name == "clear"
    assert registry.definition("NamesLedger").member("reset").name == "reset"


def test_an_event_alias_that_is_another_events_tag_is_a_definition_error() -> None:
    class Taken(akter.Event, tag="names-unit.Taken"):
        n: int

    class Taker(akter.Event, tag="names-unit.Taker", aliases=("names-unit.Taken",)):
        n: int

    class F(akter.Actor[Count], name="NamesF", events=[Taken, Taker]):
        @akter.command
        async def go(self) -> None:
            return None

    with pytest.raises(akter.DefinitionError, match=r"'names-unit\.Taken' is used by"):
        Registry([F])


# --- decoding stored events ---------------------------------------------------------------------


class Versioned(akter.Event, tag="names-unit.Versioned", version=1):
    cents: int


@Versioned.migrate(from_version=0)
def _v0(old: dict[str, Any]) -> dict[str, Any]:
    return {"cents": old["amount"] * 100}


def test_decode_stored_migrates_and_marks_what_it_cannot_read() -> None:
    tag = Versioned.event_tag
    assert decode_stored(Versioned, tag, {"amount": 2}, 0) == (Versioned(cents=200), 1)
    assert decode_stored(Versioned, tag, {"cents": 5}, 1) == (Versioned(cents=5), 1)
    # Newer than the code: raw at its stored version, never guessed at.
    assert decode_stored(Versioned, tag, {"cents": 5, "x": 1}, 2) == ({"cents": 5, "x": 1}, 2)
    # A failing migration, a failing validation, a payload that is not an object, no class.
    assert decode_stored(Versioned, tag, {"nope": 1}, 0) == ({"nope": 1}, 0)
    assert decode_stored(Versioned, tag, {"cents": "x"}, 1) == ({"cents": "x"}, 1)
    assert decode_stored(Versioned, tag, [1, 2], 1) == ([1, 2], 1)
    assert decode_stored(None, "unknown", {"a": 1}, 3) == ({"a": 1}, 3)


def test_an_event_chain_is_built_once_and_reset_by_a_new_migration() -> None:
    class Cached(akter.Event, tag="names-unit.Cached", version=2):
        n: int

    @Cached.migrate(from_version=0)
    def _a(old: dict[str, Any]) -> dict[str, Any]:
        return old

    with pytest.raises(akter.DefinitionError):
        Cached.event_chain()  # version=2 needs two migrations

    @Cached.migrate(from_version=1)
    def _b(old: dict[str, Any]) -> dict[str, Any]:
        return old

    chain = Cached.event_chain()
    assert chain.version == 2 and Cached.event_chain() is chain
    # A subclass has its own chain, not its base's cached one.

    class Child(Cached, tag="names-unit.Child", version=0):
        pass

    assert Child.event_chain().version == 0 and Cached.event_chain() is chain


# --- the orphan comparison ----------------------------------------------------------------------


def test_declared_names_are_commands_jobs_and_declared_event_tags() -> None:
    assert declared_names([LEDGER]) == [
        ("NamesLedger", "command", "add"),
        ("NamesLedger", "command", "reset"),
        ("NamesLedger", "event", "names-unit.Renamed"),
        ("NamesLedger", "job", "settle"),
    ]


def test_names_claimed_by_a_name_or_an_alias() -> None:
    assert claims(LEDGER, "command", "add") and claims(LEDGER, "command", "add_old")
    assert not claims(LEDGER, "command", "total")  # a query: a stored intent cannot reach it
    assert not claims(LEDGER, "command", "settle")  # a job is not a command
    assert claims(LEDGER, "job", "settle") and claims(LEDGER, "job", "settle_old")
    assert not claims(LEDGER, "job", "add")
    assert claims(LEDGER, "event", "names-unit.Renamed")
    assert claims(LEDGER, "event", "names-unit.Old")
    assert not claims(LEDGER, "event", "names-unit.Gone")
    # A kind a newer deployment may record is not this code's to judge.
    assert claims(LEDGER, "query", "whatever")


def test_unclaimed_names_of_hosted_types_and_unhosted_types() -> None:
    definitions: dict[str, ActorDefinition] = {LEDGER.name: LEDGER}
    recorded = [
        ("NamesLedger", "actor_type", "NamesLedger"),
        ("NamesLedger", "command", "add_old"),
        ("NamesLedger", "command", "removed"),
        ("NamesLedger", "job", "gone"),
        ("NamesLedger", "event", "names-unit.Gone"),
        ("Elsewhere", "actor_type", "Elsewhere"),  # hosted by a live runner
        ("Elsewhere", "command", "anything"),  # judged by that runner
        ("Renamed", "actor_type", "Renamed"),  # nobody hosts it
        ("Renamed", "command", "x"),  # judged through its type
    ]
    assert unclaimed(recorded, definitions, {"Elsewhere", "NamesLedger"}) == [
        ("NamesLedger", "command", "removed"),
        ("NamesLedger", "job", "gone"),
        ("NamesLedger", "event", "names-unit.Gone"),
        ("Renamed", "actor_type", "Renamed"),
    ]


def test_an_orphan_names_its_fix() -> None:
    assert "name='Old'" in Orphan("actor_type", "Old", "Old", {}).fix
    assert "aliases=('x',)" in Orphan("command", "T", "x", {}).fix
    assert "@akter.job" in Orphan("job", "T", "j", {}).fix
    assert "event class" in Orphan("event", "T", "E", {}).fix
