"""The "Evolving your actors" examples run as printed, over rows written by version 1.

The examples are on docs/guides/evolution.md.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import akter

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "evolution.md"


def block(heading: str) -> str:
    """The first python block after ``heading`` on the docs page."""
    text = README.read_text("utf-8")
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


def run_block(heading: str, then: str = "", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the block, then ``then`` (more source in the block's namespace), and return it."""
    namespace: dict[str, Any] = {
        "__name__": f"readme_{uuid.uuid4().hex[:6]}",
        # What the section's first block imports, for the blocks after it.
        "Any": Any,
        "BaseModel": BaseModel,
        "akter": akter,
        **(extra or {}),
    }
    exec(compile(block(heading), f"README {heading}", "exec"), namespace)
    exec(compile(textwrap.dedent(then), "the test's additions", "exec"), namespace)
    return namespace


class ProfileV1(BaseModel):
    name: str = ""
    cents: int = 0


class CustomerV1(akter.Actor[ProfileV1], name="Customer"):
    @akter.command
    async def register(self, name: str, cents: int) -> None:
        self.state.name, self.state.cents = name, cents


class NameV0(BaseModel):
    name: str = ""


class PersonV0(akter.Actor[NameV0], name="Person"):
    @akter.command
    async def register(self, name: str) -> None:
        self.state.name = name


async def _state(t: Any, actor_type: str, actor_id: str) -> dict[str, Any]:
    [row] = await t.rows(
        "SELECT state, state_version FROM {schema}.actors"
        " WHERE actor_type = %(t)s AND actor_id = %(i)s",
        {"t": actor_type, "i": actor_id},
    )
    return dict(row)


async def test_the_safe_field_rename_moves_the_value(akter_test: Any) -> None:
    v2 = run_block(
        "## A safe field rename",
        then="""
        class Touch(Customer, name="Customer"):
            @akter.command
            async def add(self, cents: int) -> int:
                self.state.cents += cents
                return self.state.cents

            @akter.query
            async def full_name(self) -> str:
                return self.state.full_name
        """,
    )
    touch = v2["Touch"]

    async with akter_test([CustomerV1]) as t:
        await t.get(CustomerV1, "c-1").register("Ada Lovelace", 500)
        schema = t.runtime.schema
        async with akter.Runtime(
            [touch], database_url=t.runtime.database_url, schema=schema
        ) as runtime:
            handle: Any = runtime.get(touch, "c-1")
            assert await handle.full_name() == "Ada Lovelace"
            assert await _state(t, "Customer", "c-1") == {
                "state": {"name": "Ada Lovelace", "cents": 500},
                "state_version": 0,
            }  # a query migrates in memory and writes nothing
            assert await handle.add(1) == 501
            assert await _state(t, "Customer", "c-1") == {
                "state": {"full_name": "Ada Lovelace", "cents": 501},
                "state_version": 1,
            }


async def test_without_the_migration_the_loss_guard_refuses(akter_test: Any) -> None:
    v2 = run_block(
        "## A safe field rename",
        then="""
        class Careless(akter.Actor[Profile], name="Customer"):
            @akter.command
            async def add(self, cents: int) -> None:
                self.state.cents += cents
        """,
    )
    careless = v2["Careless"]

    async with akter_test([CustomerV1]) as t:
        await t.get(CustomerV1, "c-1").register("Ada Lovelace", 500)
        before = await _state(t, "Customer", "c-1")
        async with akter.Runtime(
            [careless], database_url=t.runtime.database_url, schema=t.runtime.schema
        ) as runtime:
            handle: Any = runtime.get(careless, "c-1")
            with pytest.raises(akter.ActorError) as info:
                await handle.add(1)
        assert info.value.reason == "Defect"
        assert re.search(r"holds 'name', which Profile would drop", info.value.message)
        assert await _state(t, "Customer", "c-1") == before


async def test_the_typed_state_split(akter_test: Any) -> None:
    v2 = run_block(
        "## A safe state split",
        then="""
        class Reader(Person, name="Person"):
            @akter.query
            async def parts(self) -> list[str]:
                return [self.state.first, self.state.last]
        """,
    )
    reader = v2["Reader"]

    async with akter_test([PersonV0]) as t:
        await t.get(PersonV0, "p-1").register("Grace Hopper")
        async with akter.Runtime(
            [reader], database_url=t.runtime.database_url, schema=t.runtime.schema
        ) as runtime:
            handle: Any = runtime.get(reader, "p-1")
            assert await handle.parts() == ["Grace", "Hopper"]


async def test_a_rolling_deploy_that_adds_a_defaulted_field(akter_db: str) -> None:
    namespace = run_block("## What a rolling deploy may change safely")
    schema = f"akter_t_{uuid.uuid4().hex[:12]}"
    try:
        await namespace["rolling_deploy"](akter_db, schema)
    finally:
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
