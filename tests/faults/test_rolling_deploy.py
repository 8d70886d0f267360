"""The rolling-deploy drill (issue 38): v1 and v2 runner processes over one database under load.

See :mod:`tests.faults.deploy_drill`. One short run per change in the normal run; the ``slow``
variant runs a longer load with several seeds.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from tests.faults.deploy_drill import CASES as DRILL_CASES
from tests.faults.deploy_drill import drill

pytestmark = pytest.mark.timeout(300)

CASE_ACTORS = {case: actors for case, (_, _, actors, _) in DRILL_CASES.items()}
CASES = ["field", "rename", "command", "step"]


@pytest.fixture
async def schema(akter_db: str) -> AsyncIterator[str]:
    name = f"akter_t_{uuid.uuid4().hex[:12]}"
    yield name
    async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.parametrize("case", CASES)
async def test_a_rolling_deploy_under_load_loses_and_doubles_nothing(
    akter_db: str, schema: str, case: str
) -> None:
    ledger = await drill(akter_db, schema, case, per_phase=12)
    assert len(ledger.acked) == 48 + 2 * len(CASE_ACTORS[case])
    if case in ("field", "rename"):
        # The older runner met rows the newer code wrote, and refused them retryably.
        assert ledger.retried["StateTooNew"] > 0, ledger.retried


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
async def test_a_rolling_deploy_under_a_longer_load(
    akter_db: str, schema: str, case: str, seed: int
) -> None:
    ledger = await drill(akter_db, schema, case, per_phase=60, seed=seed)
    assert len(ledger.acked) == 240 + 2 * len(CASE_ACTORS[case])
