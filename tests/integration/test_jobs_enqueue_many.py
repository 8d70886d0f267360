"""``self.enqueue_many(job, payloads)`` (issue 45, semantics §5.3): many jobs of one declaration.

Every payload is validated before anything is staged: one invalid payload refuses the whole call
with ``InvalidInput`` naming its index (raised inside the handler, where it can be caught), and
no row of it is written, even when the handler catches the error and commits. Staged rows are
written with the turn's other outbox rows, in the turn's one ``insert_outbox`` statement. The
docs' example (docs/guides/jobs.md, "Enqueuing many jobs") runs as its own block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, Field

import akter
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Item(BaseModel):
    n: int = Field(ge=0)


class Tray(BaseModel):
    squares: list[dict[str, Any]] = Field(default_factory=list)
    refused: str | None = None
    touched: int = 0


class Squarer(akter.Actor[Tray], access=akter.public):
    @akter.command
    async def many(self, ns: list[int], priority: int | None = None) -> list[str]:
        self.state.touched += 1
        # model_construct skips validation here: enqueue_many must catch a bad payload itself.
        items = [Item.model_construct(n=n) for n in ns]
        return self.enqueue_many(Squarer.square, items, priority=priority)

    @akter.command
    async def many_caught(self, ns: list[int]) -> str | None:
        self.state.touched += 1
        try:
            self.enqueue_many(Squarer.square, [Item.model_construct(n=n) for n in ns])
        except akter.ActorError as exc:
            self.state.refused = exc.field
        return self.state.refused

    @akter.command
    async def not_a_list(self) -> list[str]:
        return self.enqueue_many(Squarer.square, Item(n=1))  # type: ignore[arg-type]

    @akter.command
    async def other_actors_job(self) -> list[str]:
        return self.enqueue_many(Other.noop, [Item(n=1)])

    @akter.query
    async def tray(self) -> dict[str, Any]:
        return self.state.model_dump()

    @akter.job(attempts=1)
    async def square(call: akter.JobCall, item: Item) -> int:
        return item.n * item.n

    @square.on_success
    async def squared(self, result: int) -> None:
        self.state.squares.append({"id": self.command_id, "value": result})


class Other(akter.Actor[Tray], access=akter.public):
    @akter.job(attempts=1)
    async def noop(call: akter.JobCall, item: Item) -> None:
        return None


async def job_rows(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT intent_id, kind, command, payload, priority, xmin::text AS tx"
        " FROM {schema}.outbox ORDER BY intent_id"
    )


async def test_many_jobs_are_staged_in_order_and_each_routes_its_own_result(
    akter_test: Make,
) -> None:
    async with akter_test([Squarer, Other], relay=False) as t:
        s = t.get(Squarer, "s1")
        ids = await s.many([1, 2, 3, 4, 5], priority=7)
        assert len(ids) == len(set(ids)) == 5
        rows = await job_rows(t)
        by_id = {str(r["intent_id"]): r for r in rows}
        assert [by_id[i]["payload"] for i in ids] == [f'{{"n":{n}}}' for n in (1, 2, 3, 4, 5)]
        assert {(r["kind"], r["command"], r["priority"]) for r in rows} == {("job", "square", 7)}
        assert len({r["tx"] for r in rows}) == 1  # the turn's one transaction
        await t.advance(0)
        squares = (await s.tray())["squares"]
        assert sorted((sq["id"], sq["value"]) for sq in squares) == sorted(
            zip(ids, [1, 4, 9, 16, 25], strict=True)
        )
        assert await job_rows(t) == []


async def test_an_empty_list_stages_nothing(akter_test: Make) -> None:
    async with akter_test([Squarer, Other], relay=False) as t:
        assert await t.get(Squarer, "s1").many([]) == []
        assert await job_rows(t) == []


async def test_one_invalid_payload_refuses_the_whole_call_and_writes_nothing(
    akter_test: Make,
) -> None:
    async with akter_test([Squarer, Other], relay=False) as t:
        s = t.get(Squarer, "s1")
        # The call raises InvalidInput inside the handler; uncaught, it is the handler's defect
        # (as for enqueue), and nothing of the turn is written.
        with pytest.raises(akter.ActorError) as refused:
            await s.many([1, 2, -3, 4])
        assert refused.value.reason == "Defect"
        assert "enqueue_many() payload 2 for job 'square'" in refused.value.message
        assert "Nothing was enqueued." in refused.value.message
        assert await job_rows(t) == []
        assert (await s.tray())["touched"] == 0  # the refused turn committed nothing


async def test_a_handler_that_catches_the_refusal_commits_without_any_of_the_jobs(
    akter_test: Make,
) -> None:
    async with akter_test([Squarer, Other], relay=False) as t:
        s = t.get(Squarer, "s1")
        assert await s.many_caught([5, -1, 6]) == "[1].n"
        tray = await s.tray()
        assert (tray["touched"], tray["refused"]) == (1, "[1].n")  # the turn committed
        assert await job_rows(t) == []  # ... and none of the three jobs


async def test_a_single_payload_or_another_actors_job_is_refused(akter_test: Make) -> None:
    async with akter_test([Squarer, Other], relay=False) as t:
        s = t.get(Squarer, "s1")
        with pytest.raises(akter.ActorError, match="enqueue_many\\(\\) takes a list of payloads"):
            await s.not_a_list()
        with pytest.raises(akter.ActorError, match="enqueue_many\\(\\) takes a job of 'Squarer'"):
            await s.other_actors_job()
        assert await job_rows(t) == []
