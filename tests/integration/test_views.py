"""The read-only inspection views: a SQL contract for operators."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from akter.testing import ActorTest
from tests.integration.actors import ALL, Counter

Make = Callable[..., ActorTest]


async def test_views_show_actors_outbox_jobs_and_refuse_writes(
    akter_test: Make, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "c1", tenant="acme")
        await counter.stage_everything(3)  # state, an event, an intent, a timer and a job
        [actor] = await t.rows("SELECT * FROM {schema}.v_actors")
        assert (actor["tenant_id"], actor["actor_id"], actor["version"]) == ("acme", "c1", 1)
        assert actor["receipts"] == 1 and actor["state"]["n"] == 3
        roles = sorted(r["role"] for r in await t.rows("SELECT role FROM {schema}.v_outbox"))
        assert roles == ["intent", "job", "timer"]
        [job] = await t.rows("SELECT * FROM {schema}.v_jobs")
        assert (job["job"], job["status"], job["job_key"], job["attempts"]) == (
            "work",
            "pending",
            "w",
            0,
        )
        assert await t.rows("SELECT * FROM {schema}.v_dead_letters") == []
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            for view in ("v_actors", "v_outbox", "v_jobs", "v_dead_letters"):
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                    await conn.execute(
                        t.runtime.store.queries.substitute(f"DELETE FROM {{schema}}.{view}")
                    )
