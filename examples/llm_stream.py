"""Streaming an LLM's tokens from a job, across a retry (docs/guides/job-streams.md).

Run it with ``python -m examples.llm_stream`` (an embedded PostgreSQL unless
``$AKTER_DATABASE_URL`` is set; its tables live in the schema ``llm_stream``). The fake model
drops its connection halfway through the first attempt: the reader shows the first attempt's
tokens, is told that attempt 2 starts (and clears what it showed), then shows attempt 2's
tokens and the outcome. Its test is ``tests/integration/test_example_llm_stream.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

import akter
from akter.job_streams import AttemptStarted, Chunk, Closed


class Prompt(BaseModel):
    text: str
    flaky: bool = True


class ChatState(BaseModel):
    answer: str | None = None


async def fake_model(prompt: str, attempt: int, flaky: bool) -> AsyncIterator[str]:
    """A stand-in for a model's streaming API: yields tokens, fails once halfway if ``flaky``."""
    tokens = ["The ", "answer ", "to ", f"'{prompt}' ", "is ", "42."]
    for i, token in enumerate(tokens):
        if flaky and attempt == 1 and i == 3:
            raise ConnectionError("the model's connection dropped")
        await asyncio.sleep(0.01)
        yield token


class Chat(akter.Actor[ChatState], access=akter.public):
    @akter.command
    async def ask(self, text: str, flaky: bool = True) -> str:
        return self.enqueue(Chat.complete, Prompt(text=text, flaky=flaky))

    @akter.query
    async def answer(self) -> str | None:
        return self.state.answer

    @akter.job(attempts=3, backoff=(0.05, 0.05), timeout=30)
    async def complete(call: akter.JobCall, prompt: Prompt) -> str:
        answer = ""
        async for token in fake_model(prompt.text, call.attempt, prompt.flaky):
            call.stream(token)  # batched, stored in order; readers see it within ms
            answer += token
        return answer

    @complete.on_success
    async def completed(self, answer: str) -> None:
        self.state.answer = answer


async def show(chat: Chat, job_id: str) -> tuple[str, list[str]]:
    """What a UI does: render tokens, start over on a new attempt, stop at the close."""
    shown, log = "", list[str]()
    async for item in chat.job_stream(job_id):
        match item:
            case AttemptStarted(attempt=attempt):
                shown = ""  # an earlier attempt's tokens are not part of the answer
                log.append(f"[attempt {attempt}]")
            case Chunk(data=token):
                shown += str(token)
                log.append(str(token))
            case Closed(outcome=outcome):
                log.append(f"[{outcome}]")
    return shown, log


async def main(**options: Any) -> str:
    """Ask once and print the stream as it comes (``options``: a test's database and schema)."""
    options.setdefault("schema", "llm_stream")
    async with akter.Runtime([Chat], **options) as runtime:
        chat = runtime.get(Chat, "c-1")
        job_id = await chat.ask("life")
        shown, log = await show(chat, job_id)
    print(" | ".join(log))
    print("answer:", shown)
    return shown


if __name__ == "__main__":
    asyncio.run(main())
