"""SIGKILL of a process that staged a command in its own transaction (issue 41, part 1).

The child (:mod:`tests.faults.stage_child`) stages ``Account.deposit`` on its own connection and
waits; the parent SIGKILLs it before its COMMIT (the server rolls the transaction back when the
connection ends: the command never exists) or after it (the row is durable: the relay delivers
it exactly once, and its outcome is readable by id). The checks read durable rows only, after
the child's backend has ended.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from akter.testing import ActorTest
from tests._support.polling import until
from tests.faults.child_process import ChildProcess, start_module
from tests.integration.stage_actors import ALL

pytestmark = pytest.mark.timeout(90)

#: Longest wait for a killed child's backend to end.
BACKEND_GONE_WITHIN = 20.0


async def backend_gone(t: ActorTest, tag: str) -> None:
    """Until no backend of the child's connection is left (its transaction has ended)."""

    async def backends() -> list[dict[str, Any]]:
        sql = "SELECT 1 FROM pg_stat_activity WHERE application_name = %(tag)s"
        return await t.rows(sql, {"tag": tag})

    await until(
        backends, within=BACKEND_GONE_WITHIN, what="the child's backend to end", holds=_empty
    )


def _empty(rows: list[dict[str, Any]]) -> bool:
    return not rows


async def deliveries(t: ActorTest, actor_id: str) -> list[str]:
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Account' AND actor_id = %(id)s",
        {"id": actor_id},
    )
    return [s["cid"] for s in rows[0]["state"]["seen"]] if rows else []


async def staged_child(t: ActorTest, actor_id: str) -> tuple[ChildProcess, str, str]:
    tag = f"akter-stage-{uuid.uuid4().hex[:8]}"
    proc = await start_module("tests.faults.stage_child", t.database_url, t.schema, tag, actor_id)
    child = ChildProcess(proc, "staging child")
    line = await child.line()
    assert line.startswith("STAGED "), line
    return child, tag, line.split()[1]


async def test_killed_before_commit_never_delivers(akter_test: Any) -> None:
    async with akter_test(ALL, relay=False) as t:
        child, tag, cid = await staged_child(t, "k-1")
        async with child:
            await child.kill()
        await backend_gone(t, tag)
        assert await t.rows("SELECT intent_id FROM {schema}.outbox") == []
        await t.drain()
        assert await deliveries(t, "k-1") == []
        with pytest.raises(Exception) as caught:
            await t.runtime.outcome(cid, timeout=0.2)
        assert getattr(caught.value, "reason", None) == "Timeout"


async def test_killed_after_commit_delivers_once(akter_test: Any) -> None:
    async with akter_test(ALL, relay=False) as t:
        child, tag, cid = await staged_child(t, "k-2")
        async with child:
            await child.send("COMMIT")
            assert await child.line() == "COMMITTED"
            await child.kill()
        await backend_gone(t, tag)
        rows = await t.rows("SELECT intent_id FROM {schema}.outbox")
        assert [r["intent_id"] for r in rows] == [cid]
        await t.drain()
        await t.drain()
        assert await deliveries(t, "k-2") == [cid]
        assert await t.runtime.outcome(cid, timeout=5) == 5
