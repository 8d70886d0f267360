"""A refused row statement's defect names the column or constraint, on Citus too.

A Citus worker's error reaches the coordinator without ``diag.column_name`` and
``diag.constraint_name``: the message's own words name them (docs/citus.md, owned tables).
"""

from __future__ import annotations

from types import SimpleNamespace

from akter._tables import refusal


def error(
    sqlstate: str, message: str, column: str | None = None, constraint: str | None = None
) -> SimpleNamespace:
    diag = SimpleNamespace(message_primary=message, column_name=column, constraint_name=constraint)
    return SimpleNamespace(diag=diag, sqlstate=sqlstate)


def test_plain_postgresql_fields_name_them() -> None:
    said = refusal("'t'", error("23502", 'null value in column "sku"', column="sku"))
    assert "column 'sku'" in said


def test_a_citus_workers_words_name_them() -> None:
    null = (
        'null value in column "sku" of relation "order_lines_182984" violates not-null constraint'
    )
    assert "(23502; column 'sku')" in refusal("'t'", error("23502", null))
    check = 'new row for relation "order_lines_191295" violates check constraint "cents_positive"'
    assert "(23514; constraint 'cents_positive')" in refusal("'t'", error("23514", check))


def test_suspects_name_a_value_the_server_could_not_read() -> None:
    said = refusal("'t'", error("22P02", "invalid input syntax for type bigint"), ["cents"])
    assert "column 'cents'" in said
