"""Rate keys that PostgreSQL cannot store (issue 17, adversarial): NUL, lone surrogates, huge.

A rate key function returns what real code returns: a tenant name with a NUL byte in it, a
string decoded with ``surrogateescape``, a JSON dump of a whole request. None of these can be a
``rate_buckets.key`` (text has no NUL, UTF-8 has no lone surrogate, a btree key is at most about
2.7 kB). The claim takes every claimed attempt's tokens in one statement, so one such key would
fail that statement for the whole claim, on every claim, and wedge every row claimed with it.
Instead the key is refused in Python, before the statement: the row is a defect of its job and is
dead-lettered with a cause that names the reason (docs/flow-control.md F3.4), and the rows
claimed beside it start.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Callable, Iterator

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

STARTED: list[str] = []

#: What the key function returns for each actor id: the actor id is the test's lever.
KEYS: dict[str, str] = {
    "ok": "tenant-a",
    "nul": "tenant\x00a",
    "surrogate": "tenant-\udc80",
    "huge": base64.b64encode(random.Random(7).randbytes(3750)).decode(),  # 5000, incompressible
    "wide": "\u00e9" * 512,  # 512 characters, 1,024 bytes of UTF-8: the longest usable key
}


class Item(BaseModel):
    n: int


class Tally(BaseModel):
    dead: list[str] = []


def _key(call: akter.JobCall) -> str:
    return KEYS[call.ref.id]


class _AsyncKey:
    """A callable object whose ``__call__`` is async: the definition check cannot see it."""

    async def __call__(self, call: akter.JobCall) -> str:
        return call.tenant


class Keyed(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def fill(self, n: int) -> list[str]:
        return [self.enqueue(Keyed.call_out, Item(n=i)) for i in range(n)]

    @akter.job(attempts=3, backoff=(0.01, 0.01), rate=akter.Rate(100, per=1, key=_key))
    async def call_out(call: akter.JobCall, item: Item) -> int:
        STARTED.append(f"{call.ref.id}/{item.n}")
        return item.n

    @akter.command
    async def fill_async(self) -> str:
        return self.enqueue(Keyed.awaits, Item(n=0))

    @akter.job(attempts=3, backoff=(0.01, 0.01), rate=akter.Rate(100, per=1, key=_AsyncKey()))
    async def awaits(call: akter.JobCall, item: Item) -> int:
        STARTED.append(f"awaits/{item.n}")
        return item.n

    @call_out.on_dead_letter
    async def call_out_dead(self, letter: akter.DeadLetter[Item]) -> None:
        self.state.dead.append(letter.cause)

    @akter.query
    async def dead(self) -> list[str]:
        return self.state.dead


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    STARTED.clear()
    yield
    STARTED.clear()


@pytest.mark.parametrize(
    ("actor", "reason"),
    [
        ("nul", "contains a NUL character"),
        ("surrogate", "is not valid UTF-8 (a lone surrogate)"),
        ("huge", "is 5000 bytes long (at most 1024)"),
    ],
)
async def test_an_unstorable_rate_key_dead_letters_its_row_and_the_claim_goes_on(
    akter_test: Make, actor: str, reason: str
) -> None:
    async with akter_test([Keyed], relay=False) as t:
        bad = await t.get(Keyed, actor).fill(2)
        good = await t.get(Keyed, "ok").fill(2)
        wide = await t.get(Keyed, "wide").fill(1)
        await t.advance(0)
        # The rows claimed beside the bad ones started; the bad ones never reached the executor.
        assert sorted(STARTED) == ["ok/0", "ok/1", "wide/0"]
        cause = f"Rate key of Keyed.call_out returned a key that {reason}"
        letters = await t.rows(
            "SELECT job_id, cause, ambiguous, attempts FROM {schema}.dead_letters"
            ' ORDER BY job_id COLLATE "C"'
        )
        assert letters == [
            {"job_id": j, "cause": cause, "ambiguous": False, "attempts": 1} for j in sorted(bad)
        ]
        assert await t.get(Keyed, actor).dead() == [cause, cause]
        assert await t.rows("SELECT 1 FROM {schema}.outbox") == []
        keys = await t.rows("SELECT key FROM {schema}.rate_buckets ORDER BY key")
        assert [k["key"] for k in keys] == [KEYS["ok"], KEYS["wide"]]
        assert len(good) == 2 and len(wide) == 1


def test_an_async_key_function_is_refused_at_definition() -> None:
    async def tenant(call: akter.JobCall) -> str:
        return call.tenant

    with pytest.raises(akter.DefinitionError, match="Rate key must be a plain function"):
        akter.Rate(5, key=tenant)


async def test_a_key_callable_that_returns_an_awaitable_dead_letters_its_row(
    akter_test: Make,
) -> None:
    async with akter_test([Keyed], relay=False) as t:
        job_id = await t.get(Keyed, "ok").fill_async()
        await t.advance(0)
        assert STARTED == []
        letters = await t.rows("SELECT job_id, cause FROM {schema}.dead_letters")
        assert letters == [
            {
                "job_id": job_id,
                "cause": "Rate key of Keyed.awaits raised TypeError: the key function returned"
                " an awaitable; it must return the key",
            }
        ]
        assert await t.rows("SELECT 1 FROM {schema}.rate_buckets") == []
