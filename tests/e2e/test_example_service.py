"""The FastAPI example (``examples/fastapi_service.py``) served by uvicorn on loopback.

The service's lifespan starts the runtime; akter is mounted under ``/akter``. The typed client
talks to the mount, the service's own routes call the same actors in-process as the token's user.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

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

        # The mount's own documents and feeds work under the prefix.
        spec = (await http.get("/akter/openapi.json")).json()
        assert spec["info"]["title"] == "shop actors"
        assert "/actors/Cart/{id}/add" in spec["paths"]
        assert (await http.get("/akter/docs")).status_code == 200
        service_spec = (await http.get("/openapi.json")).json()
        assert "/carts/{cart_id}/summary" in service_spec["paths"]
        async with http.stream(
            "GET", "/akter/actors/Cart/alice/events", headers=bearer(alice)
        ) as response:
            frames = await SseReader(response).take(2)
        assert [(f.id, f.event) for f in frames] == [
            ("1", "shop.ItemAdded"),
            ("2", "shop.CheckedOut"),
        ]
        assert frames[1].json()["event"] == {"items": 1}
