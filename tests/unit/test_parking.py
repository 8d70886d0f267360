"""The pure rule of what a claimed row means under the current code (evolution E3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._engine.parking import Decoded, OncePer, TooNew, Unusable, decode_intent, decode_job
from akter._members import definition_of


class Charge(BaseModel):
    cents: int
    sku: str


class Till(akter.Actor[akter.EmptyState]):
    @akter.command(version=1, aliases=("put",))
    async def deposit(self, cents: int, memo: str) -> None: ...

    @deposit.migrate_payload(from_version=0)
    def _cents(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"] * 100, "memo": old["memo"]}

    @akter.job(version=0)
    async def charge(call: akter.JobCall, payload: Charge) -> None: ...


DEFINITION = definition_of(Till)


def test_a_row_at_an_older_version_is_migrated_under_the_canonical_name() -> None:
    decoded = decode_intent(DEFINITION, "put", json.dumps({"amount": 2, "memo": "m"}), 0)
    assert decoded == Decoded("deposit", {"cents": 200, "memo": "m"}, 1)


def test_a_row_at_a_newer_version_is_too_new() -> None:
    assert isinstance(decode_intent(DEFINITION, "deposit", "{}", 2), TooNew)
    job = Till.charge
    assert isinstance(decode_job(job, "{}", 1), TooNew)


@pytest.mark.parametrize(
    ("command", "payload", "version", "expected"),
    [
        ("withdraw", "{}", 0, ["UnknownCommand", "'withdraw'", "aliases="]),
        ("deposit", '{"cents": 1}', 1, ["InvalidInput", "'memo'"]),
        ("deposit", "{}", 1, ["InvalidInput", "'cents'", "'memo'", "Failing fields"]),
        ("deposit", '{"memo": "x"}', 0, ["InvalidInput", "cannot be migrated"]),
        ("deposit", "not json", 1, ["InvalidInput", "not JSON"]),
    ],
)
def test_a_row_the_code_cannot_deliver_names_its_cause(
    command: str, payload: str, version: int, expected: list[str]
) -> None:
    outcome = decode_intent(DEFINITION, command, payload, version)
    assert isinstance(outcome, Unusable)
    for part in expected:
        assert part in outcome.cause


def test_a_job_payload_that_fails_names_every_field() -> None:
    job = Till.charge
    outcome = decode_job(job, "{}", 0)
    assert isinstance(outcome, Unusable)
    assert "'cents'" in outcome.cause and "'sku'" in outcome.cause


def test_once_per_lets_one_message_through_per_key() -> None:
    once = OncePer(3600)
    assert once.allow("A", 1) and not once.allow("A", 1) and once.allow("A", 2)
