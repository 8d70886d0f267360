"""A job's output stream read across a SIGKILL of its runner mid-attempt (issue 42).

A child runner (``tests.faults.stream_child``) claims the job and streams attempt 1's chunks,
then hangs in the executor and is SIGKILLed. A reader in the parent, opened before the kill,
keeps following; a new runner in the parent takes the row over once the dead runner's lease has
ended and runs attempt 2. The reader sees attempt 1's chunks, the marker of attempt 2, attempt
2's chunks and then the outcome, each once and in order; a late reader sees the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from akter.job_streams import AttemptStarted, Chunk, Closed, StreamItem
from akter.testing import ActorTest
from tests._support import until
from tests.faults.child_process import ChildProcess, start_module
from tests.faults.stream_actors import ACTORS, Teller

pytestmark = [pytest.mark.kill, pytest.mark.timeout(90)]

MakeTest = Callable[..., ActorTest]

LEASE_S = 3


def shape(items: list[StreamItem]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        match item:
            case AttemptStarted(_, attempt):
                out.append({"attempt": attempt})
            case Chunk(_, _, data):
                out.append(data)
            case Closed(_, outcome):
                out.append(outcome)
    return out


async def test_a_reader_follows_a_stream_across_a_killed_runner_and_the_retry(
    akter_test: MakeTest,
) -> None:
    async with akter_test(
        ACTORS, relay=False, jobs=[], lease=LEASE_S, cancel_check=1, claim_lease=3
    ) as t:
        teller = t.get(Teller, "t1")
        job_id = await teller.tell(3)
        stored = "SELECT seq FROM {schema}.job_streams WHERE job_id = %(j)s"
        proc = await start_module("tests.faults.stream_child", t.database_url, t.schema)
        async with ChildProcess(proc, "stream child") as child:
            await child.ready()
            items: list[StreamItem] = []

            async def follow() -> None:
                async for item in teller.job_stream(job_id):
                    items.append(item)

            reader = asyncio.create_task(follow(), name="test.reader")
            # Attempt 1's marker and its three chunks are committed, then its runner dies.
            await until(lambda: t.rows(stored, {"j": job_id}), holds=lambda r: len(r) == 4)
            await until(lambda: len(items) == 4)
            await child.kill()
        await t.add_runtime(jobs=None)
        await t.advance(LEASE_S + 1)  # past the dead runner's lease: attempt 2 runs here
        await asyncio.wait_for(reader, 20)
        expected = [
            {"attempt": 1}, "attempt 1 chunk 0", "attempt 1 chunk 1", "attempt 1 chunk 2",
            {"attempt": 2}, "attempt 2 chunk 0", "attempt 2 chunk 1", "attempt 2 chunk 2",
            "succeeded",
        ]  # fmt: skip
        assert shape(items) == expected
        assert [item.seq for item in items] == list(range(1, 10))
        assert await teller.told() == [2]
        late = [item async for item in teller.job_stream(job_id)]
        assert late == items
