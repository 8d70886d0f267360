"""The LLM streaming example (docs/guides/job-streams.md) runs: tokens, a retry, the outcome."""

from __future__ import annotations

import uuid

import pytest
from examples.llm_stream import Chat, main, show

from akter.testing import ActorTest

pytestmark = pytest.mark.timeout(60)


async def test_the_example_streams_both_attempts_and_the_answer(
    akter_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = f"llm_stream_{uuid.uuid4().hex[:8]}"
    try:
        assert await main(database_url=akter_db, schema=schema) == "The answer to 'life' is 42."
    finally:
        async with ActorTest([Chat], database_url=akter_db, schema=schema):
            pass  # drops the schema
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (
        "[attempt 1] | The  | answer  | to  | [attempt 2] | The  | answer  | to  | 'life'  | is  "
        "| 42. | [succeeded]"
    )


async def test_a_reader_after_the_end_sees_the_same_stream(akter_db: str) -> None:
    async with ActorTest([Chat], database_url=akter_db) as t:
        chat = t.get(Chat, "c-2")
        job_id = await chat.ask("tea", flaky=False)
        await t.drain()
        assert await chat.answer() == "The answer to 'tea' is 42."
        shown, log = await show(chat, job_id)
        assert shown == "The answer to 'tea' is 42."
        assert log[0] == "[attempt 1]" and log[-1] == "[succeeded]"
