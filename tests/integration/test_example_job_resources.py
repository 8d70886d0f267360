"""The job-resources example (docs/guides/jobs-resources.md) runs; its test fake needs no patch."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from examples.job_resources import CARDS, Wallet, main, resources

from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, fail, succeed
from tests._support import until

pytestmark = pytest.mark.timeout(60)


async def test_the_example_charges_through_the_client_its_runtime_set_up(akter_db: str) -> None:
    schema = f"job_resources_{uuid.uuid4().hex[:8]}"
    try:
        # The two jobs run side by side: their routes may commit in either order.
        assert sorted(await main(database_url=akter_db, schema=schema)) == ["ch_1", "ch_2"]
    finally:
        async with ActorTest([Wallet], database_url=akter_db, schema=schema):
            pass  # drops the schema


async def test_a_test_hands_the_job_a_fake_provider(akter_db: str) -> None:
    provider = FakeProvider()
    provider.script(fail("card declined"), succeed("ch_fake"))
    fake = resources.override(CARDS, provider)
    async with ActorTest([Wallet], database_url=akter_db, resources=fake) as t:
        wallet = t.get(Wallet, "w-1")
        job_id = await wallet.pay(500)

        async def charged() -> bool:
            await t.advance(0.1)
            return await wallet.charges() == ["ch_fake"]

        await until(charged, within=20, interval=0)
    assert [(c.job_id, c.attempt, c.outcome) for c in provider.calls] == [
        (job_id, 1, "failed"),
        (job_id, 2, "succeeded"),
    ]


def test_the_docs_blocks_are_excerpts_of_the_example_and_its_test() -> None:
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "guides" / "jobs-resources.md").read_text("utf-8")
    sources = (root / "examples" / "job_resources.py").read_text("utf-8") + Path(
        __file__
    ).read_text("utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 5
    for block in blocks:
        assert block in sources, block
