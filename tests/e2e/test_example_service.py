"""The FastAPI example (``examples/fastapi_service.py``) served by uvicorn on loopback.

The service's lifespan starts the runtime; akter is mounted under ``/akter``. The typed client
talks to the mount, the service's own routes call the same actors in-process as the token's user.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from examples.fastapi_service import Cart, CartClosed, CartState, EmptyCart, create_app

import akter
from akter.client import Client
from tests.e2e.conftest import SECRET, SseReader, assert_problem, bearer, serving, token

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def shop(akter_db: str) -> AsyncIterator[str]:
    """The service's base URL (a fresh schema, dropped afterwards)."""
    schema = f"shop_{uuid.uuid4().hex[:12]}"
    api = create_app(database_url=akter_db, schema=schema, jwt_secret=SECRET)
    try:
        async with serving(api, lifespan="on") as url:
            yield url
    finally:
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_the_mounted_actors_and_the_service_routes_share_one_runtime(shop: str) -> None:
    alice = token("alice")
    async with (
        Client(f"{shop}/akter", auth=alice) as client,
        httpx.AsyncClient(base_url=shop, headers=bearer(alice)) as http,
    ):
        assert (await http.get("/health")).json() == {"status": "ready"}
        cart = client.get(Cart, "alice")
        assert await cart.add("apple", 2) == {"apple": 2}
        assert await cart.add("pear") == {"apple": 2, "pear": 1}

        # A service route acting in-process as the token's user sees the same actor.
        summary = await http.get("/carts/alice/summary")
        assert summary.json() == {
            "cart": "alice",
            "tenant": "acme",
            "items": 3,
            "skus": ["apple", "pear"],
            "checked_out": False,
        }
        reordered = await http.post("/carts/alice/reorder", json=["fig", "apple"])
        assert reordered.json() == {"apple": 3, "pear": 1, "fig": 1}

        # An idempotent retry through the mount replays instead of adding twice.
        cid = await client.mint_command_id()
        assert await cart.with_command_id(cid).add("kiwi") == {**reordered.json(), "kiwi": 1}
        assert await cart.with_command_id(cid).add("kiwi") == {**reordered.json(), "kiwi": 1}
        assert (await cart.contents()).items["kiwi"] == 1


async def test_example_access_policy_and_declared_errors(shop: str) -> None:
    alice, bob = token("alice"), token("bob")
    async with (
        Client(f"{shop}/akter", auth=alice) as as_alice,
        Client(f"{shop}/akter", auth=bob) as as_bob,
        httpx.AsyncClient(base_url=shop) as http,
    ):
        with pytest.raises(EmptyCart) as empty:
            await as_bob.get(Cart, "bob").checkout()
        assert empty.value.cart == "bob"
        cart = as_alice.get(Cart, "alice")
        await cart.add("apple")
        assert await cart.checkout() == 1
        with pytest.raises(CartClosed):
            await cart.add("pear")
        contents = await cart.contents()
        assert contents == CartState(items={"apple": 1}, checked_out=True)

        # A user may not touch another user's cart, over the mount or the service's routes.
        with pytest.raises(akter.ActorError) as denied:
            await as_bob.get(Cart, "alice").add("pear")
        assert (denied.value.reason, denied.value.code) == ("Unauthorized", "access_denied")
        other = await http.get("/carts/alice/summary", headers=bearer(bob))
        assert (other.status_code, other.json()["code"]) == (403, "access_denied")
        anonymous = await http.get("/carts/alice/summary")
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "missing_credentials")
        mounted = await http.post("/akter/actors/Cart/alice/queries/contents", json={})
        assert_problem(mounted, 401, "Unauthorized", "missing_credentials")

        # One document: the service's describes akter's routes too; the mount serves none.
        service_spec = (await http.get("/openapi.json")).json()
        assert service_spec["info"]["title"] == "shop"
        assert "/carts/{cart_id}/summary" in service_spec["paths"]
        assert "/akter/actors/Cart/{id}/add" in service_spec["paths"]
        assert (await http.get("/akter/openapi.json")).status_code == 404
        assert (await http.get("/akter/docs")).status_code == 404
        # The mount's feeds work under the prefix.
        async with http.stream(
            "GET", "/akter/actors/Cart/alice/events", headers=bearer(alice)
        ) as response:
            frames = await SseReader(response).take(2)
        assert [(f.id, f.event) for f in frames] == [
            ("1", "shop.ItemAdded"),
            ("2", "shop.CheckedOut"),
        ]
        assert frames[1].json()["event"] == {"items": 1}


def refs(node: Any) -> set[str]:
    """Every ``$ref`` in an OpenAPI document."""
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


async def test_one_openapi_document_and_one_docs_page_describe_the_service_and_akter(
    shop: str,
) -> None:
    async with httpx.AsyncClient(base_url=shop) as http:
        spec = (await http.get("/openapi.json")).json()
        docs = await http.get("/docs")
    paths = spec["paths"]
    # The service's own routes and every akter route, under its prefix, in one document.
    assert {"/health", "/carts/{cart_id}/summary", "/carts/{cart_id}/reorder"} <= set(paths)
    assert {
        "/akter/actors/Cart/{id}/add",
        "/akter/actors/Cart/{id}/checkout",
        "/akter/actors/Cart/{id}/queries/contents",
        "/akter/actors/Cart/{id}/events",
        "/akter/command-ids",
        "/akter/ready",
    } <= set(paths)
    assert not [p for p in paths if p.startswith("/akter/openapi") or p == "/akter/docs"]
    # akter's schemas and its bearer scheme came along: every reference resolves.
    components = spec["components"]
    assert "Problem" in components["schemas"] and components["securitySchemes"]
    for ref in refs(spec):
        section, name = re.fullmatch(r"#/components/(\w+)/(.+)", ref).groups()  # type: ignore[union-attr]
        assert name in components[section], ref
    add = paths["/akter/actors/Cart/{id}/add"]["post"]
    assert add["responses"]["422"]["content"]["application/problem+json"]
    # FastAPI's one docs page reads that document.
    assert docs.status_code == 200 and "/openapi.json" in docs.text


async def test_the_service_routes_answer_errors_with_akters_problem_bodies(shop: str) -> None:
    alice, bob = token("alice"), token("bob")
    async with httpx.AsyncClient(base_url=shop) as http:
        # A refusal in a service route (an in-process query) and over akter's own route.
        for headers, status, code in (
            (bearer(bob), 403, "access_denied"),
            ({}, 401, "missing_credentials"),
        ):
            service = await http.get("/carts/alice/summary", headers=headers)
            mounted = await http.post(
                "/akter/actors/Cart/alice/queries/contents", json={}, headers=headers
            )
            body = assert_problem(service, status, "Unauthorized", code)
            assert assert_problem(mounted, status, "Unauthorized", code) == body
            assert body["type"] == "/reference/errors/#Unauthorized"
            assert service.headers.get("www-authenticate") == mounted.headers.get(
                "www-authenticate"
            )
        # A declared error in a service route (an in-process command) and over akter's route.
        as_alice = bearer(alice)
        assert (await http.post("/carts/alice/reorder", json=["fig"], headers=as_alice)).json()
        cid = (await http.post("/akter/command-ids", headers=as_alice)).json()["command_id"]
        closed = await http.post(
            "/akter/actors/Cart/alice/checkout",
            json={},
            headers={**as_alice, "Idempotency-Key": cid},
        )
        assert closed.status_code == 200, closed.text
        service = await http.post("/carts/alice/reorder", json=["pear"], headers=as_alice)
        cid = (await http.post("/akter/command-ids", headers=as_alice)).json()["command_id"]
        mounted = await http.post(
            "/akter/actors/Cart/alice/add",
            json={"sku": "pear"},
            headers={**as_alice, "Idempotency-Key": cid},
        )
        body = assert_problem(service, 422, "DeclaredError")
        assert assert_problem(mounted, 422, "DeclaredError") == body
        assert (body["error"], body["fields"]) == ("shop.CartClosed", {"cart": "alice"})
        assert body["type"] == "/reference/errors/#DeclaredError"
