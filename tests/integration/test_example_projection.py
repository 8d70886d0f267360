"""The projection example (``examples/projection.py``) rebuilds its read model from the start."""

from __future__ import annotations

import uuid

from examples.projection import SALES_AFTER, SALES_BEFORE, projection_main


async def test_the_read_model_added_later_counts_every_sale_once(akter_db: str) -> None:
    lines: list[str] = []
    totals = await projection_main(
        akter_db, schema=f"projection_{uuid.uuid4().hex[:8]}", echo=lines.append
    )
    assert totals.applied == len(SALES_BEFORE) + len(SALES_AFTER)
    assert totals.cents == {"tea": 900, "cake": 900}
    assert lines[-1] == "the read model applied 5 sales: {'tea': 900, 'cake': 900}"
