"""The storable-JSON shortcuts answer exactly as the encoder and the NaN check they skip."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akter._json import Unstorable, canonical_encode, check_finite, storable_json

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**5000])
    | st.text(max_size=8)
)


@given(_SCALARS)
def test_a_scalar_is_stored_as_the_canonical_encoder_writes_it(value: Any) -> None:
    expected: str | None
    try:
        expected = canonical_encode(value)
        expected.encode("utf-8")
    except ValueError:  # past the int/str conversion limit, or a lone surrogate
        expected = None
    if expected is None or "\\u0000" in expected:
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
