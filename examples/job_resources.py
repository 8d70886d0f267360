"""A job's dependencies: a payment client set up once per runtime, reached through the call.

Run it with ``python -m examples.job_resources`` (an embedded PostgreSQL unless
``$AKTER_DATABASE_URL`` is set; its tables live in the schema ``job_resources``). Its test,
``tests/integration/test_example_job_resources.py``, replaces the client with a
``FakeProvider``: no monkeypatching (docs/guides/jobs-resources.md).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pydantic import BaseModel, Field

import akter


class CardGateway(Protocol):
    """What the job needs of a payment provider: charge once per job id."""

    async def __call__(self, call: akter.JobCall, key: str | None = None) -> Any: ...


class HttpCardGateway:
    """The production client: one connection pool per runtime (simulated here)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.open = True
        self.charged: dict[str, str] = {}

    async def __call__(self, call: akter.JobCall, key: str | None = None) -> str:
        # The job id is the provider's idempotency key: a retried attempt charges once.
        return self.charged.setdefault(call.job_id, f"ch_{len(self.charged) + 1}")

    async def aclose(self) -> None:
        self.open = False


#: The typed key the job looks its client up by.
CARDS = akter.Resource[CardGateway]("cards")

resources = akter.Resources()


@resources.setup(CARDS)
async def cards() -> AsyncIterator[CardGateway]:
    """Made when the runtime starts, closed when it stops (after its last attempt)."""
    client = HttpCardGateway(os.environ.get("CARDS_URL", "https://cards.example"))
    yield client
    await client.aclose()


class Payment(BaseModel):
    cents: int


class Ledger(BaseModel):
    charges: list[str] = Field(default_factory=list)


class Wallet(akter.Actor[Ledger], access=akter.public):
    @akter.command
    async def pay(self, cents: int) -> str:
        return self.enqueue(Wallet.charge, Payment(cents=cents))

    @akter.job(attempts=3, backoff=(0.05, 1.0))
    async def charge(call: akter.JobCall, payment: Payment) -> str:
        gateway = call.resource(CARDS)  # look resources up before calling anything
        charge_id: str = await gateway(call)
        return charge_id

    @charge.on_success
    async def charged(self, charge_id: str) -> None:
        self.state.charges.append(charge_id)

    @akter.query
    async def charges(self) -> list[str]:
        return list(self.state.charges)


def make_runtime(**options: Any) -> akter.Runtime:
    """The application's runtime; a test passes its own ``resources=`` and database."""
    options.setdefault("resources", resources)
    options.setdefault("schema", "job_resources")
    return akter.Runtime([Wallet], **options)


async def main(**options: Any) -> list[str]:
    """Pay twice and wait for both charges to come back to the wallet (``options``: a test's)."""
    async with make_runtime(**options) as runtime:
        wallet = runtime.get(Wallet, "w-1")
        before = len(await wallet.charges())
        await wallet.pay(1200)
        await wallet.pay(300)
        charges: list[str] = []
        for _ in range(600):  # the routes commit after the attempts: poll for 30 s at most
            charges = await wallet.charges()
            if len(charges) == before + 2:
                break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError("The two charges did not come back within 30 s.")
    print("charged:", ", ".join(charges[before:]))
    return charges[before:]


if __name__ == "__main__":
    asyncio.run(main())
