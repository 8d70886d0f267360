"""Work a turn does in its flights' shadow: made while the server answers, as if made before.

The payload's hash is made while the admission flight is out, before any handler runs; the
caller's reply is decoded from its receipt while the commit flight is out (``invoke``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, model_validator

import akter
from akter._ids import payload_hash
from akter.testing import ActorTest

#: Every test runs with warm turns in one flight and in two (rule 7 of one-flight-turn.md).
pytestmark = pytest.mark.usefixtures("turn_mode")

Make = Callable[..., ActorTest]

#: What the reply model's validator saw, in order: "value" (the handler's returned model, if
#: checked again before the commit flight), "stored" (the receipt's JSON, decoded for the
#: caller). The handlers build their replies unvalidated (``model_construct``): a constructor
#: would hand the validator a dict too.
SEEN: list[str] = []


class Tally(BaseModel):
    n: int = 0


class Reply(BaseModel):
    n: int

    @model_validator(mode="before")
    @classmethod
    def _seen(cls, data: Any) -> Any:
        SEEN.append("stored" if isinstance(data, dict) else "value")
        return data


class Fussy(BaseModel):
    """A reply whose validator fails, with no ValueError, on its own stored JSON."""

    n: int

    @model_validator(mode="before")
    @classmethod
    def _refuse_stored(cls, data: Any) -> Any:
        if isinstance(data, dict):
            raise LookupError("this validator reads only instances")
        return data


class Shadows(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def keep(self, doc: dict[str, Any]) -> int:
        # A careless handler: the nested list is the caller's payload's own (pydantic copies
        # the dict, not what an ``Any`` holds).
        doc["items"].append(99)
        self.state.n += 1
        return len(doc["items"])

    @akter.command
    async def reply(self) -> Reply:
        self.state.n += 1
        return Reply.model_construct(n=self.state.n)

    @akter.command
    async def fussy(self) -> Fussy:
        self.state.n += 1
        return Fussy.model_construct(n=self.state.n)


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    SEEN.clear()


async def test_a_handler_changing_its_arguments_in_place_leaves_the_payload_hash(
    akter_test: Make,
) -> None:
    async with akter_test([Shadows]) as t:
        actor = t.get(Shadows, "s")
        cid = await t.runtime.mint_command_id()
        assert await actor.with_command_id(cid).keep({"items": [1]}) == 2
        receipt = (await t.inspect(actor)).receipts[0]
        assert receipt["payload_hash"] == payload_hash({"doc": {"items": [1]}})
        # The same call again is a replay, not a conflict: the hash is the payload's as sent.
        assert await actor.with_command_id(cid).keep({"items": [1]}) == 2
        with pytest.raises(akter.ActorError) as exc:
            await actor.with_command_id(cid).keep({"items": [1, 99]})
        assert exc.value.reason == "CommandConflict"
        assert (await t.inspect(actor)).version == 1


async def test_the_callers_reply_is_decoded_once_the_commit_flight_is_sent(
    akter_test: Make,
) -> None:
    async with akter_test([Shadows]) as t:
        actor = t.get(Shadows, "s")
        cid = await t.runtime.mint_command_id()
        pause = t.pause_next("before_commit")
        call = asyncio.create_task(actor.with_command_id(cid).reply())
        await pause.wait()
        checked = list(SEEN)
        pause.release()
        first = await call
        assert "stored" not in checked  # the receipt was made, not yet decoded for the caller
        assert SEEN == [*checked, "stored"]
        # The caller's reply is what a replay decodes from the same receipt.
        expected = Reply.model_construct(n=1)
        assert first == expected == await actor.with_command_id(cid).reply()
        assert SEEN == [*checked, "stored", "stored"]
        assert (await t.inspect(actor)).version == 1


async def test_a_committed_reply_its_annotation_cannot_read_is_returned_as_stored(
    akter_test: Make,
) -> None:
    async with akter_test([Shadows]) as t:
        actor = t.get(Shadows, "s")
        cid = await t.runtime.mint_command_id()
        # The turn commits (its result was checked as the handler returned it); the caller
        # and a replay get the stored JSON value the annotation failed to read.
        first: Any = await actor.with_command_id(cid).fussy()
        again: Any = await actor.with_command_id(cid).fussy()
        assert first == again == {"n": 1}
        row = await t.inspect(actor)
        assert row.version == 1 and row.state == {"n": 1}
        assert [r["outcome"] for r in row.receipts] == [{"ok": {"n": 1}}]
