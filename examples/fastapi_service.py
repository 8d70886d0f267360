"""akter inside a FastAPI service: shopping carts as durable actors.

The FastAPI app owns the process: its lifespan starts and drains the akter ``Runtime``;
``akter.http.fastapi.install`` serves akter's routes under ``/akter`` (commands, queries, event
feeds — with the same bearer tokens) in the app's one OpenAPI document (``/openapi.json``,
``/docs``), and answers akter's errors raised in the app's own routes with akter's problem+json.
Its own routes call the same actors in-process with the caller taken from the token. Run it
with an HS256 secret and a database (none: an embedded PostgreSQL)::

    SHOP_JWT_SECRET=... uvicorn --factory examples.fastapi_service:create_app

then, with a token whose ``sub`` is ``alice`` (a user may only use the cart named after them)::

    curl -X POST localhost:8000/akter/command-ids -H "Authorization: Bearer $TOKEN"
    curl -X POST localhost:8000/akter/actors/Cart/alice/add -H "Authorization: Bearer $TOKEN" \\
         -H "Idempotency-Key: <the command id>" -H "Content-Type: application/json" \\
         -d '{"sku": "apple", "qty": 2}'
    curl localhost:8000/carts/alice/summary -H "Authorization: Bearer $TOKEN"

or from Python, with the typed client: ``akter.client.Client("http://localhost:8000/akter",
auth=token).get(Cart, "alice").add("apple", 2)``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field

import akter
import akter.http
import akter.http.fastapi

# --- the actor --------------------------------------------------------------------------------


class CartState(BaseModel):
    items: dict[str, int] = Field(default_factory=dict)
    checked_out: bool = False


class ItemAdded(akter.Event, tag="shop.ItemAdded"):
    sku: str
    qty: int


class CheckedOut(akter.Event, tag="shop.CheckedOut"):
    items: int


class CartClosed(akter.DeclaredError, tag="shop.CartClosed"):
    cart: str


class EmptyCart(akter.DeclaredError, tag="shop.EmptyCart"):
    cart: str


Sku = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9-]+$")]
Qty = Annotated[int, Field(ge=1, le=100)]


def own_cart_only(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: str) -> bool:
    """Users may use only the cart named after them; trusted in-process code may use any."""
    if isinstance(caller, akter.System):
        return True
    return isinstance(caller, akter.User) and caller.subject == ref.id


class Cart(akter.Actor[CartState], access=own_cart_only):
    """One shopper's cart: add items, then check out once."""

    @akter.command(errors=[CartClosed])
    async def add(self, sku: Sku, qty: Qty = 1) -> dict[str, int]:
        """Add ``qty`` of ``sku``; returns the cart's items."""
        if self.state.checked_out:
            raise CartClosed(cart=self.id)
        self.state.items[sku] = self.state.items.get(sku, 0) + qty
        self.emit(ItemAdded(sku=sku, qty=qty))
        return dict(self.state.items)

    @akter.command(errors=[CartClosed, EmptyCart])
    async def checkout(self) -> int:
        """Close the cart; returns the number of items bought."""
        if self.state.checked_out:
            raise CartClosed(cart=self.id)
        if not self.state.items:
            raise EmptyCart(cart=self.id)
        self.state.checked_out = True
        count = sum(self.state.items.values())
        self.emit(CheckedOut(items=count))
        return count

    @akter.query
    async def contents(self) -> CartState:
        """The committed cart."""
        return self.state


# --- the FastAPI service ----------------------------------------------------------------------


async def identity(request: Request) -> akter.http.Identity:
    """The caller and tenant of a request, from the same bearer token akter checks."""
    auth: akter.http.AuthProvider = request.app.state.auth
    return await auth(request)


Who = Annotated[akter.http.Identity, Depends(identity)]


class Summary(BaseModel):
    cart: str
    tenant: str
    items: int
    skus: list[str]
    checked_out: bool


def create_app(
    *,
    database_url: str | None = None,
    schema: str = "akter",
    jwt_secret: str | None = None,
) -> FastAPI:
    """The service: FastAPI routes plus akter's under ``/akter``, sharing one runtime.

    Args:
        database_url: PostgreSQL URL (default ``$AKTER_DATABASE_URL``, else embedded).
        schema: The schema holding akter's tables.
        jwt_secret: The HS256 secret of bearer tokens (default ``$SHOP_JWT_SECRET``).
    """
    secret = jwt_secret or os.environ.get("SHOP_JWT_SECRET")
    if not secret:
        raise RuntimeError("Set SHOP_JWT_SECRET (the HS256 secret of the bearer tokens).")
    runtime = akter.Runtime(actors=[Cart], database_url=database_url, schema=schema)
    auth = akter.http.BearerJWT(secret)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncGenerator[None]:
        async with runtime:  # migrate, start the relay; drain on shutdown
            yield

    api = FastAPI(title="shop", lifespan=lifespan)
    api.state.runtime = runtime
    api.state.auth = auth
    # akter's routes under /akter in this app's OpenAPI document, and its problem+json errors.
    akter.http.fastapi.install(api, runtime, auth=auth, prefix="/akter")

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": runtime.readiness}

    @api.get("/carts/{cart_id}/summary")
    async def summary(cart_id: str, who: Who) -> Summary:
        # Trusted code acting for the token's user: the actor's access policy still applies.
        with akter.as_caller(who.caller):
            cart = await runtime.get(Cart, cart_id, tenant=who.tenant).contents()
        return Summary(
            cart=cart_id,
            tenant=who.tenant,
            items=sum(cart.items.values()),
            skus=sorted(cart.items),
            checked_out=cart.checked_out,
        )

    @api.post("/carts/{cart_id}/reorder")
    async def reorder(cart_id: str, skus: list[Sku], who: Who) -> dict[str, int]:
        """Add one of each sku; each add is its own idempotent turn."""
        items: dict[str, int] = {}
        with akter.as_caller(who.caller):
            cart = runtime.get(Cart, cart_id, tenant=who.tenant)
            for sku in skus:
                items = await cart.add(sku)
        return items

    return api
