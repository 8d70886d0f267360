"""Per-turn CPU of the output checks (hardening, issue 10): old encode path vs storable_json.

    .venv/bin/python bench/storable.py

The old path validated the state, dumped and canonically encoded it for the update, encoded the
receipt, and dumped the state again at commit. The new path checks NaN/inf on the Python dump,
validates, encodes with storable_json, re-decodes the state as a cold load would and decodes the
reply from the receipt text. Both run on a small state like the turn benchmark's.
"""

from __future__ import annotations

import timeit

from pydantic import BaseModel, TypeAdapter

from akter._ids import canonical_json
from akter._json import check_finite, storable_json, stored_value


class Tally(BaseModel):
    n: int = 0
    applied: list[str] = []
    data: str = ""
    tags: dict[str, int] = {}


STATE = Tally(n=5, applied=["v1.1.2.abc"] * 3, data="hello", tags={"a": 1, "b": 2})
RESULT = TypeAdapter(int)


def old() -> None:
    new = Tally.model_validate(STATE.model_dump(mode="python"))
    canonical_json(new.model_dump(mode="json"))
    canonical_json({"ok": RESULT.dump_python(RESULT.validate_python(5), mode="json")})
    canonical_json(new.model_dump(mode="json"))  # the commit flight encoded the state again


def new() -> None:
    dumped = STATE.model_dump(mode="python")
    check_finite(dumped, "state")
    state = Tally.model_validate(dumped)
    text = storable_json(state.model_dump(mode="json"), "state")
    Tally.model_validate(stored_value(text))
    check_finite(5, "result")
    result = storable_json(RESULT.dump_python(RESULT.validate_python(5), mode="json"), "result")
    RESULT.validate_python(stored_value(result))


if __name__ == "__main__":
    for fn in (old, new, old, new):
        n = 20_000
        print(f"{fn.__name__}: {timeit.timeit(fn, number=n) / n * 1e6:.1f} µs per turn")
