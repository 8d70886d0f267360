"""akter.stage through SQLAlchemy (sync and async) and Django (issue 41, part 1).

Each integration stages in the application's transaction as that library runs it: a
SQLAlchemy ``Connection`` in ``engine.begin()``, a ``Session`` in ``session.begin()``, an
``AsyncConnection`` and an ``AsyncSession``, and Django's connection in
``transaction.atomic()``; a commit is delivered once, a rollback never. Django is configured
here (``settings.configure``) against the test database, once per process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import akter
from akter.testing import ActorTest
from tests.integration.stage_actors import ALL, Account

pytestmark = pytest.mark.timeout(60)


async def seen(t: ActorTest, id: str) -> list[tuple[str, int]]:
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Account' AND actor_id = %(id)s",
        {"id": id},
    )
    return [(s["cid"], s["cents"]) for s in rows[0]["state"]["seen"]] if rows else []


def sqlalchemy_url(url: str, driver: str = "psycopg") -> str:
    return url.replace("postgresql://", f"postgresql+{driver}://", 1)


async def test_sqlalchemy_connection_and_session(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        engine = create_engine(sqlalchemy_url(akter_db))
        try:

            def stage_all() -> list[str]:
                with engine.begin() as conn:
                    conn.execute(text("SELECT 1"))
                    a = akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=1)
                with Session(engine) as session, session.begin():
                    b = akter.stage(session, Account, "a-1", schema=t.schema).deposit(cents=2)
                    ids = akter.stage_many(
                        session,
                        [akter.staged(Account, "a-1").deposit(cents=3)],
                        schema=t.schema,
                    )
                with pytest.raises(ZeroDivisionError), Session(engine) as session:
                    with session.begin():
                        akter.stage(session, Account, "a-1", schema=t.schema).deposit(cents=99)
                        raise ZeroDivisionError
                return [a, b, *ids]

            ids = await asyncio.to_thread(stage_all)
        finally:
            engine.dispose()
        await t.drain()
        assert sorted(await seen(t, "a-1")) == sorted(zip(ids, [1, 2, 3], strict=True))


async def test_sqlalchemy_async(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        engine = create_async_engine(sqlalchemy_url(akter_db))
        try:
            async with engine.begin() as conn:
                a = await akter.stage(conn, Account, "a-2", schema=t.schema).deposit(cents=1)
            async with AsyncSession(engine) as session, session.begin():
                b = await akter.astage(session, Account, "a-2", schema=t.schema).deposit(cents=2)
            with pytest.raises(ZeroDivisionError):
                async with AsyncSession(engine) as session, session.begin():
                    await akter.stage(session, Account, "a-2", schema=t.schema).deposit(cents=9)
                    raise ZeroDivisionError
        finally:
            await engine.dispose()
        await t.drain()
        assert sorted(await seen(t, "a-2")) == sorted([(a, 1), (b, 2)])


def test_sqlalchemy_driver_without_pyformat_is_refused() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn, pytest.raises(akter.ConfigurationError, match="pyformat"):
        akter.stage(conn, Account, "a-1").deposit(cents=1)


def _django(url: str) -> Any:
    """Django's connection to the test database (settings configured once per process)."""
    import django  # type: ignore[import-untyped]
    from django.conf import settings  # type: ignore[import-untyped]
    from psycopg.conninfo import conninfo_to_dict

    if not settings.configured:
        info = conninfo_to_dict(url)
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": info.get("dbname", "test"),
                    "USER": info.get("user", "postgres"),
                    "PASSWORD": info.get("password", ""),
                    "HOST": info.get("host", "127.0.0.1"),
                    "PORT": info.get("port", "5432"),
                }
            },
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
    from django.db import connection  # type: ignore[import-untyped]

    return connection


async def test_django_atomic(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:

        def stage_all() -> list[str]:
            from django.db import connections, transaction

            connection = _django(akter_db)
            try:
                with transaction.atomic():
                    with connection.cursor() as cur:
                        cur.execute("SELECT 1")
                    a = akter.stage(connection, Account, "a-3", schema=t.schema).deposit(cents=1)
                    b = akter.stage_many(
                        connections["default"],
                        [akter.staged(Account, "a-3").deposit(cents=2)],
                        schema=t.schema,
                    )[0]
                with pytest.raises(ZeroDivisionError), transaction.atomic():
                    akter.stage(connection, Account, "a-3", schema=t.schema).deposit(cents=9)
                    raise ZeroDivisionError
                pinned = "v1.1.2.0b7c6c57-4d5b-4c4a-9a0e-4c3f3b0f1a11"
                with pytest.raises(akter.ActorError), transaction.atomic():
                    stager = akter.stage(
                        connection, Account, "a-3", command_id=pinned, schema=t.schema
                    )
                    stager.deposit(cents=1)
                return [a, b]
            finally:
                connection.close()

        ids = await asyncio.to_thread(stage_all)
        await t.drain()
        assert sorted(await seen(t, "a-3")) == sorted(zip(ids, [1, 2], strict=True))
