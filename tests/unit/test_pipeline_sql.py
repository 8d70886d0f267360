"""The turn pipeline's placeholder conversion (``akter._store.pipeline``)."""

from __future__ import annotations

import psycopg
import pytest

from akter._store.pipeline import _converted
from akter._store.queries import Queries, raw_catalogue


def test_named_placeholders_number_in_first_use_order_and_repeat_their_number() -> None:
    sql, names = _converted("SELECT %(b)s, %(a)s::bigint, %(b)s IS DISTINCT FROM %(a)s", True)
    assert sql == b"SELECT $1, $2::bigint, $1 IS DISTINCT FROM $2"
    assert names == ("b", "a")


def test_an_escaped_percent_is_one_percent_and_text_without_parameters_is_left_alone() -> None:
    assert _converted("SELECT 'a%%b', %(x)s", True) == (b"SELECT 'a%b', $1", ("x",))
    assert _converted("SELECT 'a%%b' -- %(x)s", False) == (b"SELECT 'a%%b' -- %(x)s", ())


def test_a_positional_placeholder_is_refused_by_name() -> None:
    with pytest.raises(psycopg.ProgrammingError, match="named parameters only"):
        _converted("SELECT %s", True)


@pytest.mark.parametrize(
    "name",
    ["lock_actor", "admission_read", "lock_admit", "update_actor_receipt", "update_actor_receipts"],
)
def test_every_parameter_of_a_turn_statement_is_numbered(name: str) -> None:
    text = Queries("akter")[name]
    sql, names = _converted(text, True)
    assert b"%(" not in sql
    assert len(names) == len(set(names)) and all(f"%({n})s" in text for n in names)
    assert name in raw_catalogue()
