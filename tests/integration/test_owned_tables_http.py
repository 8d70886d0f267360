"""``GET /tables/{table}``: a tenant's owned rows over HTTP (docs/guides/owned-tables.md).

The tenant comes from the credentials only: another tenant's rows are never in a page, and
asking for them (an actor id of theirs, a forged cursor) answers exactly what asking for nothing
answers. The owner type's access policy decides with the kind ``rows``. Filters, cursors and
limits that are not valid are refused with named reasons, and keyset pages neither repeat nor
skip a row while rows are added between them.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.dialects.postgresql import JSONB
from starlette.requests import Request

import akter
import akter.http
from akter.actor import AccessKind
from akter.http.auth import Identity
from akter.http.console import Console
from akter.testing import ActorTest
from tests.integration.owned_actors import SCHEMA, Order, create_owned, owned_schema

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: What the console's page sends (the CSRF header) with the operator's credentials.
OPS = {"x-akter-console": "1", "x-test-user": "ops", "sec-fetch-site": "same-origin"}

ledger_metadata = sa.MetaData(schema=SCHEMA)
entries = sa.Table(
    "ledger_entries",
    ledger_metadata,
    *akter.owner_columns(),
    sa.Column("entry_no", sa.Integer, primary_key=True),
    sa.Column("memo", sa.Text, nullable=False),
    sa.Column("meta", JSONB),
)

ASKED: list[tuple[str, str, str, str, AccessKind]] = []


def auditors_only(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: AccessKind) -> bool:
    """Any caller's commands; only the user ``auditor`` reads the ledger's rows."""
    if kind == "rows":
        ASKED.append((ref.tenant, ref.type, ref.id, member, kind))
        return isinstance(caller, akter.User) and caller.subject == "auditor"
    return True


class Nothing(BaseModel):
    entries: int = 0


class Ledger(akter.Actor[Nothing], tables=[entries], access=auditors_only):
    @akter.command
    async def note(self, memo: str) -> int:
        self.state.entries += 1
        self.rows(entries).insert({"entry_no": self.state.entries, "memo": memo})
        return self.state.entries


async def by_header(request: Request) -> Identity:
    """A test provider: tenant and user from headers (never do this for real)."""
    user = request.headers.get("x-test-user")
    caller: akter.User | akter.Anonymous = akter.User(user) if user else akter.Anonymous()
    return Identity(caller, request.headers.get("x-test-tenant", "default"))


@pytest.fixture(scope="module")
def tables(akter_db: str) -> Iterator[str]:
    for schema in owned_schema(akter_db):
        create_owned(akter_db, ledger_metadata)
        yield schema


def ops_only(caller: akter.User | akter.Anonymous) -> bool:
    return isinstance(caller, akter.User) and caller.subject == "ops"


@asynccontextmanager
async def served(akter_test: Make) -> AsyncIterator[tuple[ActorTest, httpx.AsyncClient]]:
    async with akter_test([Order, Ledger]) as t:
        app = akter.http.app(t.runtime, by_header, console=Console(allow=ops_only))
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield t, http


def _table() -> str:
    return f"/tables/{SCHEMA}.order_lines"


async def test_another_tenants_rows_are_never_in_a_page(tables: str, akter_test: Make) -> None:
    mine, theirs = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    async with served(akter_test) as (t, http):
        await t.get(Order, "o-1", tenant=mine).add("apple", 120)
        await t.get(Order, "o-2", tenant=mine).add("pear", 80)
        await t.get(Order, "o-9", tenant=theirs).add("secret", 999)
        await t.get(Order, "o-1", tenant=theirs).add("also-secret", 1)
        me = {"x-test-tenant": mine}
        page = (await http.get(_table(), headers=me)).json()
        assert sorted((r["actor_id"], r["sku"]) for r in page["rows"]) == [
            ("o-1", "apple"),
            ("o-2", "pear"),
        ]
        assert {r["tenant_id"] for r in page["rows"]} == {mine}
        assert page["next"] is None
        # Their actor's id answers exactly what an id nobody uses answers: no oracle.
        their_actor = await http.get(_table(), params={"actor_id": "o-9"}, headers=me)
        nobody = await http.get(_table(), params={"actor_id": "o-404"}, headers=me)
        assert their_actor.status_code == nobody.status_code == 200
        assert their_actor.json() == nobody.json() == {"rows": [], "next": None}
        # A cursor forged from their keys only moves the start within my rows.
        rk = t.runtime.routing_key(t.runtime.ref(Order, "o-9", tenant=theirs))
        forged = _cursor([str(rk - 1), "o-9", "0"])
        page = (await http.get(_table(), params={"after": forged}, headers=me)).json()
        assert {r["tenant_id"] for r in page["rows"]} <= {mine}
        # The tenant is never a parameter, not even one's own.
        refused = await http.get(_table(), params={"tenant_id": theirs}, headers=me)
        assert refused.status_code == 400
        assert refused.json()["code"] == "tenant_filter"
        assert theirs not in refused.text


async def test_the_owner_types_policy_decides_with_the_kind_rows(
    tables: str, akter_test: Make
) -> None:
    tenant = f"l-{uuid.uuid4().hex[:6]}"
    ASKED.clear()
    async with served(akter_test) as (t, http):
        await t.get(Ledger, "l-1", tenant=tenant).note("opening")
        path = f"/tables/{SCHEMA}.ledger_entries"
        anonymous = await http.get(path, headers={"x-test-tenant": tenant})
        assert anonymous.status_code == 403  # the provider accepted no-credentials as Anonymous
        assert anonymous.json()["code"] == "access_denied"
        bob = await http.get(path, headers={"x-test-tenant": tenant, "x-test-user": "bob"})
        assert bob.status_code == 403
        assert bob.json()["reason"] == "Unauthorized"
        assert "opening" not in bob.text
        auditor = await http.get(path, headers={"x-test-tenant": tenant, "x-test-user": "auditor"})
        assert auditor.status_code == 200
        assert [r["memo"] for r in auditor.json()["rows"]] == ["opening"]
        assert ASKED[-1] == (tenant, "Ledger", "", f"{SCHEMA}.ledger_entries", "rows")
        # Refused before the filters are read: a refused caller learns nothing of them.
        bad = await http.get(
            path, params={"nope": "1"}, headers={"x-test-tenant": tenant, "x-test-user": "bob"}
        )
        assert bad.status_code == 403


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"colour": "red"}, 400, "unknown_column"),
        ({"line_no": "abc"}, 400, "invalid_filter"),
        ({"line_no": "99999999999999999999"}, 400, "invalid_filter"),
        ({"line_no": "2147483648"}, 400, "invalid_filter"),  # an integer column: 32 bits
        ({"sku": "a\x00b"}, 400, "invalid_filter"),
        ({"routing_key": "1.5"}, 400, "invalid_filter"),
        ({"limit": "0"}, 400, "invalid_limit"),
        ({"limit": "501"}, 400, "invalid_limit"),
        ({"limit": "ten"}, 400, "invalid_limit"),
        ({"after": "not a cursor"}, 400, "malformed"),
        ({"after": base64.urlsafe_b64encode(b'["1"]').decode()}, 400, "malformed"),
        ({"after": base64.urlsafe_b64encode(b'["x","o","1"]').decode()}, 400, "malformed"),
    ],
)
async def test_bad_filters_are_refused_with_named_reasons(
    tables: str, akter_test: Make, params: dict[str, str], status: int, code: str
) -> None:
    async with served(akter_test) as (_, http):
        answer = await http.get(_table(), params=params)
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["code"] == code


async def test_other_refusals_name_their_reason(tables: str, akter_test: Make) -> None:
    async with served(akter_test) as (_, http):
        twice = await http.get(f"{_table()}?sku=a&sku=b")
        assert (twice.status_code, twice.json()["code"]) == (400, "repeated_parameter")
        unknown = await http.get("/tables/nope")
        assert (unknown.status_code, unknown.json()["code"]) == (404, "unknown_table")
        jsonb = await http.get(
            f"/tables/{SCHEMA}.ledger_entries",
            params={"meta": "{}"},
            headers={"x-test-user": "auditor"},
        )
        assert (jsonb.status_code, jsonb.json()["code"]) == (400, "unfilterable_column")
        write = await http.post(_table(), json={})
        assert write.status_code == 405


async def test_keyset_pages_neither_repeat_nor_skip(tables: str, akter_test: Make) -> None:
    tenant = f"p-{uuid.uuid4().hex[:6]}"
    headers = {"x-test-tenant": tenant}
    async with served(akter_test) as (t, http):
        for i in range(3):
            await t.get(Order, f"o-{i}", tenant=tenant).add_many(3)
        seen: list[tuple[Any, ...]] = []
        after: str | None = None
        pages = 0
        while True:
            params = {"limit": "2", **({"after": after} if after else {})}
            page = (await http.get(_table(), params=params, headers=headers)).json()
            seen += [(r["routing_key"], r["actor_id"], r["line_no"]) for r in page["rows"]]
            pages += 1
            if pages == 2:
                # Rows added meanwhile, before and after the cursor's place.
                for i in range(3):
                    await t.get(Order, f"o-{i}", tenant=tenant).add("late", 1)
            after = page["next"]
            if after is None:
                break
        assert seen == sorted(seen)  # primary key order, each row once
        assert len(seen) == len(set(seen))
        everything = (await http.get(_table(), params={"limit": "500"}, headers=headers)).json()
        every = [(r["routing_key"], r["actor_id"], r["line_no"]) for r in everything["rows"]]
        before = {k for k in every if k[2] <= 3}
        assert before <= set(seen)  # every row there from the start was seen once
        # A filter on a declared column, paged too.
        one = await http.get(_table(), params={"actor_id": "o-1", "limit": "2"}, headers=headers)
        assert [r["line_no"] for r in one.json()["rows"]] == [1, 2]
        rest = await http.get(
            _table(), params={"actor_id": "o-1", "after": one.json()["next"]}, headers=headers
        )
        assert [r["line_no"] for r in rest.json()["rows"]] == [3, 4]


def _cursor(values: list[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


async def test_the_console_reads_any_tenants_rows_for_operators_only(
    tables: str, akter_test: Make
) -> None:
    tenant = f"c-{uuid.uuid4().hex[:6]}"
    async with served(akter_test) as (t, http):
        await t.get(Order, "o-1", tenant=tenant).add("apple", 120)
        await t.get(Ledger, "l-1", tenant=tenant).note("opening")
        listed = (await http.get("/console/api/tables", headers=OPS)).json()["tables"]
        by_name = {t["table"]: t for t in listed}
        assert by_name[f"{SCHEMA}.order_lines"]["owner"] == "Order"
        assert by_name[f"{SCHEMA}.ledger_entries"]["key"] == [
            "routing_key",
            "tenant_id",
            "actor_id",
            "entry_no",
        ]
        # The operator names the tenant; the owner's policy is not asked (auditors_only).
        page = await http.get(
            "/console/api/table",
            params={"table": f"{SCHEMA}.ledger_entries", "tenant": tenant, "actor_id": "l-1"},
            headers=OPS,
        )
        assert page.status_code == 200, page.text
        assert [r["memo"] for r in page.json()["rows"]] == ["opening"]
        assert page.json()["tenant"] == tenant
        # The same refusals as the HTTP route.
        bad = await http.get(
            "/console/api/table",
            params={"table": f"{SCHEMA}.order_lines", "tenant": tenant, "line_no": "x"},
            headers=OPS,
        )
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_filter")
        missing = await http.get("/console/api/table", params={"table": "nope"}, headers=OPS)
        assert (missing.status_code, missing.json()["code"]) == (404, "unknown_table")
        # Not an operator: refused, rows unseen.
        for headers in ({**OPS, "x-test-user": "bob"}, {"x-test-user": "ops"}):
            refused = await http.get(
                "/console/api/table",
                params={"table": f"{SCHEMA}.order_lines", "tenant": tenant},
                headers=headers,
            )
            assert refused.status_code == 403
            assert "apple" not in refused.text
