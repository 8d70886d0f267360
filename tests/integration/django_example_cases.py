"""The Django example (examples/django_app) under ``django.test.Client``, on a real PostgreSQL.

Run by ``test_example_django.py`` in a pytest process of its own: Django is configured once per
process, from the example's settings module, for one schema of its own (a new one per run:
concurrent runs never collide), dropped at the end. The staging view
writes its order and its command in one ``transaction.atomic()``; the runner that delivers them
is the example's management command, in a child process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from examples.django_app.bank.actors import Account
from psycopg import sql

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schema(akter_db: str) -> Iterator[str]:
    name = f"django_app_{uuid.uuid4().hex[:10]}"
    os.environ.update(
        AKTER_DATABASE_URL=akter_db,
        DJANGO_APP_SCHEMA=name,
        DJANGO_SETTINGS_MODULE="examples.django_app.settings",
    )
    import django  # type: ignore[import-untyped]
    from django.core.management import call_command  # type: ignore[import-untyped]
    from django.db import connections  # type: ignore[import-untyped]

    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        django.setup()
        call_command("migrate", "bank", verbosity=0)
        yield name
    finally:
        from examples.django_app.bank.runtime import shutdown

        shutdown()
        connections.close_all()
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def client(schema: str) -> Any:
    from django.test import Client  # type: ignore[import-untyped]

    return Client()


def rows(akter_db: str, schema: str, query: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(akter_db) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return conn.execute(query.encode(), args).fetchall()


def test_a_view_calls_an_actor_through_the_processes_sync_runtime(
    client: Any, akter_db: str, schema: str
) -> None:
    reply = client.post("/accounts/a-1/deposit", {"cents": 500}, content_type="application/json")
    assert (reply.status_code, reply.json()) == (200, {"cents": 500})
    assert client.get("/accounts/a-1").json() == {"cents": 500}
    invalid = client.post("/accounts/a-1/deposit", {"cents": "x"}, content_type="application/json")
    assert (invalid.status_code, invalid.json()) == (
        400,
        {"reason": "InvalidInput", "field": "cents"},
    )
    assert rows(
        akter_db, schema, "SELECT state->>'cents' FROM actors WHERE actor_id = %s", "a-1"
    ) == [("500",)]


class Runner:
    """The example's ``manage.py akter_runner`` in a child process."""

    def __init__(self, akter_db: str, schema: str) -> None:
        env = {
            **os.environ,
            "AKTER_DATABASE_URL": akter_db,
            "DJANGO_APP_SCHEMA": schema,
            "DJANGO_SETTINGS_MODULE": "examples.django_app.settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.django_app.manage", "akter_runner"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def ready(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode, out, err


def test_the_order_view_stages_in_its_transaction_and_the_runner_delivers_once(
    client: Any, akter_db: str, schema: str
) -> None:
    placed = client.post(
        "/orders", {"account": "b-1", "cents": 70}, content_type="application/json"
    )
    assert placed.status_code == 202, placed.content
    cid = placed.json()["command_id"]
    rolled_back = client.post(
        "/orders", {"account": "b-1", "cents": 9, "fail": True}, content_type="application/json"
    )
    assert (rolled_back.status_code, rolled_back.json()) == (409, {"rolled_back": True})
    invalid = client.post(
        "/orders", {"account": "b-1", "cents": "x"}, content_type="application/json"
    )
    assert (invalid.status_code, invalid.json()) == (
        400,
        {"reason": "InvalidInput", "field": "cents"},
    )
    # The committed order, and only it, is in the app's table; nothing was delivered yet.
    assert rows(akter_db, schema, "SELECT account, cents, command_id FROM bank_order") == [
        ("b-1", 70, cid)
    ]
    assert rows(akter_db, schema, "SELECT 1 FROM actors WHERE actor_id = 'b-1'") == []
    runner = Runner(akter_db, schema)
    try:
        assert runner.ready().startswith("runner "), runner.stop()
        from examples.django_app.bank.runtime import runtime

        assert runtime().outcome(cid, timeout=30) == 70  # the receipt of the delivery
        assert runtime().get(Account, "b-1").call(Account.balance) == 70
    finally:
        code, out, err = runner.stop()
    assert code == 0, err
    assert out.splitlines()[-1] == "drained clean", out
    assert rows(akter_db, schema, "SELECT state->>'cents' FROM actors WHERE actor_id = 'b-1'") == [
        ("70",)
    ]  # delivered once: the rolled-back order's 9 cents never arrived
