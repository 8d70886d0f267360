"""A job's progress is scoped by actor and tenant (issue 38, finding 8; semantics §5.11).

A job id that belongs to another actor, or to the same actor id in another tenant, is exactly as
unknown as a job id no row names: the same refusal (``unknown_job``, 404 over HTTP), the same
body, and no subscription left behind — even while that job runs on this very runner, where the
hub knows it (before the fix the reader was subscribed and its stream closed when the other
tenant's job ended: an existence and timing oracle).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from starlette.requests import Request

import akter
import akter.http
from akter._ids import mint_command_id
from akter.http.auth import Identity
from akter.http.problems import status_of
from akter.testing import ActorTest
from tests._support import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

GATE = asyncio.Event()


class Step(BaseModel):
    done: int = 0


class Nothing(BaseModel):
    pass


class Vault(akter.Actor[Nothing], access=akter.public):
    @akter.command
    async def open_vault(self) -> str:
        return self.enqueue(Vault.crack, Nothing())

    @akter.job(attempts=1, timeout=20, progress=Step)
    async def crack(call: akter.JobCall, payload: Nothing) -> int:
        call.report(Step(done=1))
        await GATE.wait()
        return 1


@pytest.fixture(autouse=True)
def gate() -> None:
    global GATE
    GATE = asyncio.Event()


async def by_header(request: Request) -> Identity:
    """A test provider: the tenant is the ``X-Test-Tenant`` header (never do this for real)."""
    return Identity(akter.Anonymous(), request.headers.get("x-test-tenant", "default"))


def _blank(text: str, *job_ids: str) -> str:
    for job_id in job_ids:
        text = text.replace(job_id, "<job>")
    return text


async def test_progress_of_another_tenants_job_is_unknown(akter_test: Make) -> None:
    async with akter_test([Vault], relay=False) as t:
        owner = t.get(Vault, "v1", tenant="acme")
        job_id = await owner.open_vault()
        assert await t.runtime._jobs.run_pass() == 1  # running here, held at the gate
        hub = t.runtime._jobs.progress
        await until(lambda: hub.live(job_id))
        never = mint_command_id(int(time.time() * 1000), 60_000)

        # In process: another tenant's actor of the same id, another actor of the same tenant.
        refusals: dict[str, tuple[Any, ...]] = {}
        for name, handle, asked in (
            ("other tenant", t.get(Vault, "v1", tenant="globex"), job_id),
            ("other actor", t.get(Vault, "v2", tenant="acme"), job_id),
            ("never existed", t.get(Vault, "v2", tenant="acme"), never),
        ):
            with pytest.raises(akter.ActorError) as refused:
                await anext(aiter(handle.progress(asked)))
            error = refused.value
            refusals[name] = (
                error.reason,
                error.code,
                status_of(error),
                _blank(error.message.replace("'v1'", "'v2'"), job_id, never),
            )
            assert hub.subscribers(job_id) == 0, name
        assert refusals["other tenant"] == refusals["other actor"] == refusals["never existed"]
        assert refusals["never existed"][:3] == ("InvalidInput", "unknown_job", 404)

        # Over HTTP: the same 404 problem for each, and no stream opened.
        transport = httpx.ASGITransport(akter.http.app(t.runtime, by_header))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answers = {}
            for name, tenant, actor_id, asked in (
                ("other tenant", "globex", "v1", job_id),
                ("other actor", "acme", "v2", job_id),
                ("never existed", "acme", "v2", never),
            ):
                answer = await http.get(
                    f"/actors/Vault/{actor_id}/jobs/{asked}/progress",
                    headers={"X-Test-Tenant": tenant},
                )
                body = answer.json()
                body["detail"] = _blank(body["detail"].replace("'v1'", "'v2'"), job_id, never)
                answers[name] = (answer.status_code, answer.headers["content-type"], body)
                assert hub.subscribers(job_id) == 0, name
            assert answers["other tenant"] == answers["other actor"] == answers["never existed"]
            status, media, body = answers["never existed"]
            assert (status, body["code"]) == (404, "unknown_job")
            assert media.startswith("application/problem+json")

        # The owner still reads its own job's frames, then the close.
        own = aiter(owner.progress(job_id))
        first = await asyncio.wait_for(anext(own), 10)
        assert first["frame"] == {"done": 1} and first["ref"]["tenant"] == "acme"
        GATE.set()
        rest = [message async for message in own]
        assert rest[-1]["closed"] is True and rest[-1]["outcome"] == "succeeded"
