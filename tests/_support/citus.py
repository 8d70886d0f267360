"""Whether this test process runs the Citus pass (``make test-citus``).

The pass points ``AKTER_TEST_DATABASE_URL`` at the coordinator named by ``AKTER_TEST_CITUS_URL``.
Child runner processes inherit both, so they agree with their parent. Flow control
(``concurrency=``, ``rate=``) runs there too (docs/flow-control.md F2.7); what the pass skips is
what Citus cannot do: ``v_jobs`` (not plannable) and triggers on distributed tables.
"""

from __future__ import annotations

import os

ON_CITUS = os.environ.get("AKTER_TEST_CITUS_URL", "") != "" and os.environ.get(
    "AKTER_TEST_CITUS_URL"
) == os.environ.get("AKTER_TEST_DATABASE_URL")


def trigger_refused(what: str, table: str) -> str:
    """The skip reason of a test whose evidence ``what`` is written by a trigger on ``table``."""
    return (
        f"{what} is written by a trigger on {table}, and Citus refuses triggers on "
        "distributed tables"
    )
