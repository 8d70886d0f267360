"""The start check of owned tables, and the Alembic order of a column added while runners run.

docs/guides/owned-tables.md ("The rules", "Evolution with Alembic").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

import akter
from akter.testing import ActorTest
from tests.integration.owned_actors import create_owned, distribute_owned

Make = Callable[..., ActorTest]


@pytest.fixture
def schema(akter_db: str) -> Iterator[str]:
    name = f"owned_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def ddl(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


class Notes(BaseModel):
    n: int = 0


def notes_actor(table: sa.Table) -> type[akter.Actor[Notes]]:
    class Notebook(akter.Actor[Notes], tables=[table], access=akter.public):
        @akter.command
        async def note(self, text: str) -> int:
            self.state.n += 1
            self.rows(table).insert({"n": self.state.n, "text": text})
            return self.state.n

    return Notebook


def notes_table(schema: str, *more: sa.Column[Any]) -> sa.Table:
    return sa.Table(
        "notes",
        sa.MetaData(schema=schema),
        *akter.owner_columns(),
        sa.Column("n", sa.Integer, primary_key=True),
        sa.Column("text", sa.Text),
        *more,
    )


@pytest.mark.parametrize(
    ("create", "named"),
    [
        (None, "does not exist"),
        (
            "CREATE TABLE {s}.notes (routing_key bigint, tenant_id text NOT NULL,"
            " actor_id text NOT NULL, n int, text text, PRIMARY KEY (tenant_id, actor_id, n))",
            "'routing_key' as bigint (want bigint NOT NULL)",
        ),
        (
            "CREATE TABLE {s}.notes (routing_key bigint NOT NULL, tenant_id text NOT NULL,"
            " actor_id text NOT NULL, n int, PRIMARY KEY (routing_key, tenant_id, actor_id, n))",
            "lacks the declared column(s) 'text'",
        ),
        (
            "CREATE TABLE {s}.notes (routing_key bigint NOT NULL, tenant_id text NOT NULL,"
            " actor_id text NOT NULL, n int, text text, PRIMARY KEY (n, routing_key, tenant_id))",
            "primary key led by",
        ),
    ],
)
async def test_start_refuses_an_owned_table_that_disagrees(
    akter_db: str, akter_test: Make, schema: str, create: str | None, named: str
) -> None:
    if create is not None:
        ddl(akter_db, create.format(s=f'"{schema}"'))
    with pytest.raises(akter.OwnedTableError) as raised:
        async with akter_test([notes_actor(notes_table(schema))]):
            pass
    assert f"'{schema}.notes' (owned by Notebook)" in str(raised.value)
    assert named in str(raised.value)


def test_a_table_has_one_owner_type(schema: str) -> None:
    table = notes_table(schema)
    notes_actor(table)
    with pytest.raises(akter.DefinitionError, match="one owner type"):

        class Other(akter.Actor[Notes], tables=[table]):
            pass


def test_a_declaration_without_ownership_columns_is_refused() -> None:
    bare = sa.Table("bare", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    with pytest.raises(akter.DefinitionError, match="lacks the ownership column"):

        class Bare(akter.Actor[Notes], tables=[bare]):
            pass


async def test_an_adopted_table_is_written_under_its_own_column_names(
    akter_db: str, akter_test: Make, schema: str
) -> None:
    ddl(
        akter_db,
        f'CREATE TABLE "{schema}".ledger (shard bigint NOT NULL, org text NOT NULL,'
        " account text NOT NULL, n int, text text, PRIMARY KEY (shard, org, account, n))",
    )
    legacy = sa.Table(
        "ledger",
        sa.MetaData(schema=schema),
        sa.Column("shard", sa.BigInteger, primary_key=True),
        sa.Column("org", sa.Text, primary_key=True),
        sa.Column("account", sa.Text, primary_key=True),
        sa.Column("n", sa.Integer, primary_key=True),
        sa.Column("text", sa.Text),
    )
    adopted = akter.owned(legacy, routing_key="shard", tenant_id="org", actor_id="account")
    distribute_owned(akter_db, legacy)
    async with akter_test([notes_actor(adopted.table)]) as t:
        book = t.get(t.runtime.definitions["Notebook"].cls, "acc-1", tenant="t1")
        assert await book.note("hello") == 1
        found = await t.rows(f'SELECT org, account, n, text FROM "{schema}".ledger')
        assert found == [{"org": "t1", "account": "acc-1", "n": 1, "text": "hello"}]


async def test_alembic_order_add_the_column_first_then_the_code(
    akter_db: str, akter_test: Make, schema: str
) -> None:
    """Expand: migrate, old runners keep running; new code before the migration is refused."""
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(akter_db))
    old = notes_table(schema)
    with engine.begin() as conn:
        old.metadata.create_all(conn)
    distribute_owned(akter_db, old)
    new = notes_table(schema, sa.Column("mood", sa.Text, server_default="calm"))
    async with akter_test([notes_actor(old)]) as t:
        book = t.get(t.runtime.definitions["Notebook"].cls, "b-1")
        assert await book.note("before") == 1
        # new code started before the migration: refused at start, naming the column
        with pytest.raises(akter.OwnedTableError, match="'mood'"):
            await t.add_runtime(actors=[notes_actor(new)])
        # the migration (what Alembic's op.add_column emits), while the old runner runs
        from alembic.migration import MigrationContext
        from alembic.operations import Operations

        with engine.begin() as conn:
            Operations(MigrationContext.configure(conn)).add_column(
                "notes", sa.Column("mood", sa.Text, server_default="calm"), schema=schema
            )
        assert await book.note("during") == 2  # the old code neither names nor needs it
    async with akter_test([notes_actor(new)]) as t2:
        book = t2.get(t2.runtime.definitions["Notebook"].cls, "b-2")
        assert await book.note("after") == 1
    engine.dispose()
    found = await t2.rows(f'SELECT actor_id, text, mood FROM "{schema}".notes ORDER BY 1, 2')
    assert [(r["actor_id"], r["text"], r["mood"]) for r in found] == [
        ("b-1", "before", "calm"),
        ("b-1", "during", "calm"),
        ("b-2", "after", "calm"),
    ]


async def test_akter_check_reports_a_drifted_owned_table(
    akter_db: str, akter_test: Make, schema: str
) -> None:
    table = notes_table(schema)
    create_owned(akter_db, table.metadata)
    async with akter_test([notes_actor(table)]) as t:
        assert [f for f in (await t.check()).findings if f.kind == "owned_table"] == []
        ddl(akter_db, f'ALTER TABLE "{schema}".notes DROP COLUMN text')  # a careless migration
        (finding,) = [f for f in (await t.check()).findings if f.kind == "owned_table"]
        assert finding.severity == "error" and finding.actor_type == "Notebook"
        assert "lacks the declared column(s) 'text'" in finding.message


@pytest.mark.parametrize(
    "distribute",
    [
        None,  # left a local table on the coordinator
        "SELECT create_distributed_table('{t}', 'tenant_id')",  # by another column
        "SELECT create_distributed_table('{t}', 'routing_key', colocate_with => 'none')",
    ],
)
async def test_on_citus_start_refuses_an_owned_table_not_colocated_with_the_actors(
    akter_db: str, akter_test: Make, schema: str, distribute: str | None
) -> None:
    """docs/guides/owned-tables.md, "On Citus": the start check names the table."""
    with psycopg.connect(akter_db, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is None:
            pytest.skip("not a Citus coordinator (AKTER_TEST_DATABASE_URL; docs/citus.md)")
    table = notes_table(schema)
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(akter_db))
    with engine.begin() as conn:
        table.metadata.create_all(conn)
    engine.dispose()
    if distribute is not None:
        ddl(akter_db, distribute.format(t=f'"{schema}".notes'))
    with pytest.raises(akter.OwnedTableError) as raised:
        async with akter_test([notes_actor(table)]):
            pass
    assert f"'{schema}.notes' (owned by Notebook) is not distributed by 'routing_key'" in str(
        raised.value
    )
