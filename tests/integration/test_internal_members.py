"""Internal commands and internal workflows (issue 38, finding 7).

``internal=True`` means "only System callers": a workflow's command steps (a System caller) may
call an internal command; a handle, ``Runtime.call`` and HTTP refuse it with a reason naming it
internal. ``@akter.workflow(internal=True)`` may be started by a turn (``self.start_workflow``)
and by System code in-process; a User or Anonymous caller is refused in-process and over HTTP
(404 ``unknown_member``, as for internal commands), and OpenAPI does not list it. Every refusal
writes no row.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from pydantic import BaseModel

import akter
import akter.http
from akter.http.problems import status_of
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Ledger(BaseModel):
    marks: list[str] = []


class Vault(akter.Actor[Ledger], access=akter.public):
    @akter.command(internal=True)
    async def mark(self, text: str) -> int:
        self.state.marks.append(text)
        return len(self.state.marks)

    @akter.command
    async def begin_sweep(self) -> str:
        return self.start_workflow(Vault.sweep)

    @akter.query
    async def marks(self) -> list[str]:
        return self.state.marks

    @akter.workflow
    async def marking(wf: akter.Workflow, text: str) -> int:
        """A public workflow whose one step is the internal command."""
        return await wf.get(Vault, wf.ref.id).mark(text)

    @akter.workflow(internal=True)
    async def sweep(wf: akter.Workflow) -> int:
        """An internal workflow: only System callers may start it."""
        return await wf.get(Vault, wf.ref.id).mark("swept")


async def count(t: ActorTest, table: str) -> int:
    rows = await t.rows(f"SELECT count(*) AS n FROM {{schema}}.{table}")
    return int(rows[0]["n"])


def http(t: ActorTest) -> httpx.AsyncClient:
    """The runtime's ASGI app with no auth provider: every request is ``Anonymous``."""
    transport = httpx.ASGITransport(akter.http.app(t.runtime))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def assert_named_internal(exc: akter.ActorError, name: str) -> None:
    assert (exc.reason, exc.code, status_of(exc)) == ("InvalidInput", "unknown_member", 404)
    assert f"Vault.{name} is internal" in exc.message, exc.message


async def test_workflow_step_calls_an_internal_command(akter_test: Make) -> None:
    async with akter_test([Vault]) as t:
        run = await t.get(Vault, "v-1").marking.start("hello")
        await t.drain()
        assert await run.result(timeout=10) == 1
        assert await t.get(Vault, "v-1").marks() == ["hello"]
        status = await t.workflow(run.id)
        assert status.status == "completed"
        assert [(s.kind, s.name, s.status) for s in status.steps] == [
            ("command", "Vault.mark", "done")
        ]
        receipts = await t.rows("SELECT command, caller_key FROM {schema}.receipts")
        assert [r["command"] for r in receipts] == ["mark"]


async def test_internal_command_refusal_names_it_internal(akter_test: Make) -> None:
    async with akter_test([Vault]) as t:
        vault = t.get(Vault, "v-2")
        with pytest.raises(akter.ActorError) as by_system:
            await vault.mark("x")  # absent from handles, even for System code
        assert_named_internal(by_system.value, "mark")
        with akter.as_caller(akter.User("mallory")):
            with pytest.raises(akter.ActorError) as by_user:
                await vault.mark("x")
            assert_named_internal(by_user.value, "mark")
            with pytest.raises(akter.ActorError) as by_call:
                await t.runtime.call(Vault, "v-2", "mark", {"text": "x"})
            assert_named_internal(by_call.value, "mark")
        async with http(t) as client:
            key = await t.runtime.mint_command_id()
            answer = await client.post(
                "/actors/Vault/v-2/mark", json={"text": "x"}, headers={"Idempotency-Key": key}
            )
            assert answer.status_code == 404, answer.text
            assert answer.json()["code"] == "unknown_member"
            assert "Vault.mark is internal" in answer.json()["detail"]
            document = (await client.get("/openapi.json")).json()
        assert "/actors/Vault/{id}/mark" not in document["paths"]
        assert await vault.marks() == []
        assert await count(t, "receipts") == 0
        assert await count(t, "actors") == 0


async def test_internal_workflow_is_refused_to_users(akter_test: Make) -> None:
    async with akter_test([Vault]) as t:
        vault = t.get(Vault, "v-3")
        for caller in (akter.User("mallory"), akter.Anonymous()):
            with akter.as_caller(caller), pytest.raises(akter.ActorError) as refused:
                await vault.sweep.start()
            assert_named_internal(refused.value, "sweep")
        async with http(t) as client:
            key = await t.runtime.mint_command_id()
            answer = await client.post(
                "/actors/Vault/v-3/workflows/sweep", json={}, headers={"Idempotency-Key": key}
            )
            assert answer.status_code == 404, answer.text
            assert answer.json()["code"] == "unknown_member"
            assert "Vault.sweep is internal" in answer.json()["detail"]
            # Whatever else is wrong with the request, an internal workflow is refused first.
            bare = await client.post("/actors/Vault/v-3/workflows/sweep", json={"x": 1})
            assert (bare.status_code, bare.json()["code"]) == (404, "unknown_member")
            document = (await client.get("/openapi.json")).json()
        assert "/actors/Vault/{id}/workflows/sweep" not in document["paths"]
        assert "/actors/Vault/{id}/workflows/marking" in document["paths"]
        assert await count(t, "workflows") == 0
        assert await count(t, "outbox") == 0
        assert await vault.marks() == []
        # System callers start it: a turn (self.start_workflow, delivered by the relay) ...
        with akter.as_caller(akter.User("alice")):
            await vault.begin_sweep()
        await t.drain()
        # ... and in-process System code.
        run = await t.get(Vault, "v-4").sweep.start()
        await t.drain()
        assert await run.result(timeout=10) == 1
        assert await vault.marks() == ["swept"]
        assert await t.get(Vault, "v-4").marks() == ["swept"]
        rows = await t.rows("SELECT actor_id, status FROM {schema}.workflows ORDER BY actor_id")
        assert [(r["actor_id"], r["status"]) for r in rows] == [
            ("v-3", "completed"),
            ("v-4", "completed"),
        ]
