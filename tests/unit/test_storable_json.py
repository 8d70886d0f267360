"""The storable-JSON shortcuts answer exactly as the encoder and the NaN check they skip."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from akter._json import (
    ReusedEncoder,
    Unstorable,
    canonical_encode,
    check_finite,
    storable_json,
)

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**5000])
    | st.text(max_size=8)
)


@given(_SCALARS)
@example("\\u0000")  # a backslash and "u0000": text, not a NUL (the oracle once mistook it)
@example("\x00")
def test_a_scalar_is_stored_as_the_canonical_encoder_writes_it(value: Any) -> None:
    expected: str | None
    try:
        expected = canonical_encode(value)
        expected.encode("utf-8")
    except ValueError:  # past the int/str conversion limit, or a lone surrogate
        expected = None
    # PostgreSQL's jsonb refuses a NUL character (JSON writes it \u0000); an escaped backslash
    # followed by "u0000" in the text is not one.
    if expected is None or (isinstance(value, str) and "\x00" in value):
        with pytest.raises(Unstorable):
            storable_json(value, "result")
    else:
        assert storable_json(value, "result") == expected
        assert json.loads(storable_json(value, "result")) == value


@given(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=4)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=3)
)
def test_the_nan_check_refuses_exactly_the_values_holding_a_nan_or_an_infinity(value: Any) -> None:
    floats = value if isinstance(value, list) else [value]
    bad = any(isinstance(f, float) and not math.isfinite(f) for f in floats)
    if bad:
        with pytest.raises(Unstorable):
            check_finite(value, "result")
    else:
        check_finite(value, "result")


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
_OPTIONS: list[dict[str, Any]] = [
    {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False, "allow_nan": False},
    {"allow_nan": False, "skipkeys": True, "check_circular": False},
    {},
]


def _stdlib(options: dict[str, Any], value: Any) -> tuple[str, str]:
    try:
        return "ok", json.JSONEncoder(**options).encode(value)
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


def _reused(encode: ReusedEncoder, value: Any) -> tuple[str, str]:
    try:
        return "ok", encode(value)
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


@given(st.lists(_JSONISH | st.just(object()), min_size=1, max_size=5))
def test_a_reused_encoder_writes_and_refuses_as_the_stdlib_encoder(values: list[Any]) -> None:
    # One encoder through a sequence of values: a refusal (NaN, a foreign object) must leave it
    # as good as new for the next value.
    for options in _OPTIONS:
        encode = ReusedEncoder(**options)
        for value in values:
            assert _reused(encode, value) == _stdlib(options, value)


def test_a_reused_encoder_still_refuses_a_cycle_and_recovers() -> None:
    encode = ReusedEncoder(sort_keys=True)
    looped: list[Any] = [1]
    looped.append(looped)
    for _ in range(2):
        with pytest.raises(ValueError, match="Circular reference"):
            encode({"a": looped})
        assert encode({"b": [1, 2], "a": {"c": None}}) == '{"a": {"c": null}, "b": [1, 2]}'


def test_a_reused_encoder_keeps_one_encoder_per_thread() -> None:
    # Two threads encode the same list at once, each paused inside it (in ``default``, Python
    # code, where the GIL passes): with one shared encoder, the second would find the first's
    # circular-reference marker for the list and refuse it as a cycle.
    inside = threading.Barrier(2, timeout=10)

    def default(o: object) -> str:
        inside.wait()
        return "x"

    encode = ReusedEncoder(default=default)
    shared = [object()]
    with ThreadPoolExecutor(2) as pool:
        results = [f.result() for f in [pool.submit(encode, shared) for _ in range(2)]]
    assert results == ['["x"]', '["x"]']


@given(st.dictionaries(st.text(max_size=3), _SCALARS | st.floats(allow_nan=True), max_size=4))
def test_the_nan_check_of_a_flat_object_matches_the_walk(value: dict[str, Any]) -> None:
    bad = any(isinstance(v, float) and not math.isfinite(v) for v in value.values())
    if bad:
        with pytest.raises(Unstorable):
            check_finite(value, "state")
    else:
        check_finite(value, "state")


@pytest.mark.parametrize(
    "value", [10**5000, {"a": 10**5000}, [1.5, [10**5000]]], ids=["bare", "flat", "nested"]
)
def test_an_integer_past_the_conversion_limit_is_not_called_a_nan(value: Any) -> None:
    check_finite(value, "result")  # not a float problem: the dump that follows names it
    with pytest.raises(Unstorable, match="integer of more than 4300 digits"):
        storable_json(value, "result")


def test_a_nan_beside_a_huge_integer_is_still_refused() -> None:
    # The encoder stops at the first bad value: the integer, here, before the NaN.
    with pytest.raises(Unstorable, match=r"state\.b is NaN"):
        check_finite({"a": 10**5000, "b": float("nan")}, "state")
