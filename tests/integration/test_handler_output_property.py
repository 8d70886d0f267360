"""Hardening (issue 10): a property test over everything a handler can hand to a turn.

Values drawn from JSON-like shapes that include NUL, lone surrogates, NaN and infinities, ints
beyond 2**64 (and past the int/str limit), nesting to depth 2,000 and 2 MB strings go into an
event, a return value, a declared error's field or the state. Every call ends either as a success
whose replay (same command id) equals the reply, type for type, or as ``Defect`` / ``InvalidInput``
with no row changed; after each example another actor's command is served within 1 s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import akter
from akter.testing import ActorTest
from tests.integration.output_actors import ALL, OUTPUTS, Output
from tests.integration.test_handler_output import _shape, written

# Stand-ins the examples carry (their repr stays printable); `_materialize` swaps them in.
_HUGE_INT = "<10**5000>"
_BIG_TEXT = "<2 MB of text>"


def _materialize(value: Any) -> Any:
    if value == _HUGE_INT:
        return 10**5000
    if value == _BIG_TEXT:
        return "z" * 2_000_000
    if isinstance(value, str) and value.startswith("<nested "):
        return _nested(int(value[8:-1]))
    if isinstance(value, list):
        return [_materialize(v) for v in value]
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    return value


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
    max_size=8,
)
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**64, -(2**64) - 1, _HUGE_INT]),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
    st.sampled_from(["a\x00b", "\ud800", "x\udfffy", "\\u0000", "1e+16"]),
    st.sampled_from([0, 150, 199, 250, 2_000]).map(lambda depth: f"<nested {depth}>"),
    st.just(_BIG_TEXT),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=8,
)
_TARGETS = st.sampled_from(["reply", "say", "refuse", "store"])


async def _one(t: ActorTest, target: str, value: Any) -> None:
    key = uuid.uuid4().hex
    OUTPUTS[key] = _materialize(value)
    actor_id = f"p-{key[:12]}"
    await t.get(Output, actor_id).bump()
    before = await written(t)
    cid = await t.runtime.mint_command_id()
    try:
        first: Any = await t.runtime.call(Output, actor_id, target, {"key": key}, command_id=cid)
    except akter.DeclaredError as declared:
        first = declared
    except akter.ActorError as refused:
        assert refused.reason in ("Defect", "InvalidInput"), refused
        assert not refused.retryable
        assert await written(t) == before, "a refused turn changed rows"
        first = refused
    if not isinstance(first, akter.ActorError):
        try:
            again: Any = await t.runtime.call(
                Output, actor_id, target, {"key": key}, command_id=cid
            )
        except akter.DeclaredError as declared:
            again = declared
        if isinstance(first, akter.DeclaredError):
            assert isinstance(again, akter.DeclaredError)
            assert _shape(first.fields) == _shape(again.fields)
        else:
            assert _shape(first) == _shape(again)
    del OUTPUTS[key]
    started = time.monotonic()
    await t.get(Output, "other").bump()
    assert time.monotonic() - started < 1.0, "the runtime stalled after the example"


def _check_property(akter_db: str, **options: Any) -> None:
    """Run the property on one runtime (its own event loop: Hypothesis drives it from sync code)."""
    loop = asyncio.new_event_loop()
    t = ActorTest(ALL, database_url=akter_db, relay=False)
    loop.run_until_complete(t.__aenter__())
    try:

        @settings(
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            **options,
        )
        @given(target=_TARGETS, value=_VALUES)
        def example(target: str, value: Any) -> None:
            loop.run_until_complete(_one(t, target, value))

        example()
    finally:
        loop.run_until_complete(t.__aexit__(None, None, None))
        loop.close()


def test_h_property_handler_outputs_commit_replayably_or_are_refused(akter_db: str) -> None:
    _check_property(akter_db, max_examples=60, derandomize=True)


@pytest.mark.slow
def test_h_property_handler_outputs_many_examples(akter_db: str) -> None:
    """The same property with more (random) examples, for local runs (-m slow)."""
    _check_property(akter_db, max_examples=600)
