"""The Flask example (examples/flask_app.py, docs/guides/sync.md) under Flask's test client.

The views block on one shared ``akter.SyncRuntime``; the test reads the committed rows.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from examples.flask_app import Account, create_app
from flask.testing import FlaskClient
from psycopg import sql

import akter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def schema(akter_db: str) -> Iterator[str]:
    name = f"flask_app_{uuid.uuid4().hex[:10]}"  # one per run: concurrent runs never collide
    yield name
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def client(akter_db: str, schema: str) -> Iterator[FlaskClient]:
    with akter.SyncRuntime(actors=[Account], database_url=akter_db, schema=schema) as rt:
        app = create_app(rt)
        app.testing = True
        yield app.test_client()


def committed(akter_db: str, schema: str, id: str) -> object:
    with psycopg.connect(akter_db) as conn:
        row = conn.execute(
            sql.SQL("SELECT state FROM {}.actors WHERE actor_id = %s").format(
                sql.Identifier(schema)
            ),
            (id,),
        ).fetchone()
    return None if row is None else row[0]


def test_views_call_the_actor_and_its_turns_commit(
    client: FlaskClient, akter_db: str, schema: str
) -> None:
    assert client.post("/accounts/a-1/deposit", json={"cents": 500}).get_json() == {"cents": 500}
    reply = client.post("/accounts/a-1/withdraw", json={"cents": 200}, headers={"X-User": "bo"})
    assert reply.get_json() == {"cents": 300}
    assert client.get("/accounts/a-1").get_json() == {"cents": 300}
    assert committed(akter_db, schema, "a-1") == {"cents": 300}


def test_refusals_are_answered_and_write_nothing(
    client: FlaskClient, akter_db: str, schema: str
) -> None:
    client.post("/accounts/a-2/deposit", json={"cents": 5})
    declared = client.post("/accounts/a-2/withdraw", json={"cents": 9})
    assert (declared.status_code, declared.get_json()) == (
        409,
        {"error": "flask_app.Overdrawn", "fields": {"short": 4}},
    )
    invalid = client.post("/accounts/a-2/deposit", json={"cents": "lots"})
    assert invalid.status_code == 400
    assert (invalid.get_json()["reason"], invalid.get_json()["field"]) == ("InvalidInput", "cents")
    bad_id = client.get("/accounts/" + "x" * 300)
    assert (bad_id.status_code, bad_id.get_json()["reason"]) == (400, "InvalidInput")
    assert committed(akter_db, schema, "a-2") == {"cents": 5}


def test_concurrent_requests_share_the_runtime(
    client: FlaskClient, akter_db: str, schema: str
) -> None:
    threads, calls = 8, 10
    start = threading.Barrier(threads)
    statuses: list[int] = []

    def requests() -> None:
        start.wait()
        for _ in range(calls):
            statuses.append(client.post("/accounts/a-3/deposit", json={"cents": 1}).status_code)

    pool = [threading.Thread(target=requests) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert statuses == [200] * threads * calls
    assert committed(akter_db, schema, "a-3") == {"cents": threads * calls}


def test_the_guides_flask_blocks_are_excerpts_of_the_example() -> None:
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "guides" / "sync.md").read_text("utf-8")
    source = (root / "examples" / "flask_app.py").read_text("utf-8")
    section = page[page.index("## Flask") : page.index("## From async code")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        assert block in source, block
