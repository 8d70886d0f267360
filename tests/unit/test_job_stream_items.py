"""The rules of a chunk and the wire form of stream items (akter.job_streams), no database."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from akter.job_streams import (
    MAX_CHUNK_BYTES,
    AttemptStarted,
    Chunk,
    Closed,
    JobStreamError,
    StreamItem,
    encode_chunk,
    item_from_json,
    item_to_json,
)


class Token(BaseModel):
    text: str
    logprob: float


def test_a_chunk_is_its_canonical_json_and_its_size() -> None:
    assert encode_chunk("héllo") == ('"héllo"', len('"héllo"'.encode()))
    assert encode_chunk({"b": 1, "a": [True, None]}) == ('{"a":[true,null],"b":1}', 23)
    assert encode_chunk(Token(text="hi", logprob=-0.5))[0] == '{"logprob":-0.5,"text":"hi"}'


def test_the_bound_counts_utf8_bytes_with_the_quotes() -> None:
    fits = "x" * (MAX_CHUNK_BYTES - 2)
    assert encode_chunk(fits)[1] == MAX_CHUNK_BYTES
    with pytest.raises(JobStreamError) as over:
        encode_chunk(fits + "x")
    assert over.value.code == "chunk_too_large"
    with pytest.raises(JobStreamError) as wide:
        encode_chunk("é" * (MAX_CHUNK_BYTES // 2))  # two bytes each
    assert wide.value.code == "chunk_too_large"


@pytest.mark.parametrize("value", [{1, 2}, float("nan"), float("inf"), object(), {"k": b"x"}])
def test_what_json_cannot_hold_is_refused_by_name(value: object) -> None:
    with pytest.raises(JobStreamError) as refused:
        encode_chunk(value)
    assert refused.value.code == "chunk_not_json"


def test_items_round_trip_through_their_wire_form() -> None:
    items: list[StreamItem] = [
        AttemptStarted(1, 2),
        Chunk(2, 2, {"t": "x"}),
        Chunk(3, 2, None),
        Closed(4, "cancelled"),
        Closed(5, "succeeded", 2),
    ]
    for item in items:
        wire = json.loads(json.dumps(item_to_json(item)))
        assert item_from_json(wire) == item
    assert item_to_json(AttemptStarted(5, 3)) == {"seq": 5, "type": "attempt", "attempt": 3}


@pytest.mark.parametrize(
    "wire",
    [{"seq": 1, "type": "closed", "outcome": "exploded"}, {"seq": 1, "type": "frame"}],
)
def test_an_unknown_wire_item_is_refused(wire: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="Not a job stream item"):
        item_from_json(wire)
