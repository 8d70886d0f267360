"""Workflows over HTTP through a real uvicorn server (the workflows spec, W1; WF-12).

Starts (idempotent by Idempotency-Key), status, signals, cancels and results through raw httpx
requests and through ``akter.Client`` (``handle.<workflow>.start`` and ``WorkflowRun``); the
steps feed as server-sent events, resumed with ``Last-Event-ID``; the access policy asked with
the kinds and members the routes promise; and adversarial bodies.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

import akter
import akter.http
from akter.http._workflows import POLL_FIRST
from tests._support import until
from tests.e2e import test_http_schemathesis as st
from tests.e2e.conftest import Account, Serve, Served, SseReader, assert_problem, count, token

pytestmark = pytest.mark.timeout(180)

ALICE = token("alice")
MALLORY = token("mallory")
ALICE_ELSEWHERE = token("alice", "globex")
ALICE_AT_HOME = token("alice", "default")

#: What the access policy was asked: (subject, member, kind).
ASKED: list[tuple[str, str, str]] = []


def shop_access(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: str) -> bool:
    """Users other than mallory, and the framework (a workflow's command steps)."""
    if isinstance(caller, akter.User):
        ASKED.append((caller.subject, member, kind))
        return caller.subject != "mallory"
    return isinstance(caller, akter.System)


class Note(BaseModel):
    text: str


class Go(BaseModel):
    pass


class Marks(BaseModel):
    marks: list[str] = []


class Shop(akter.Actor[Marks], access=shop_access):
    @akter.command
    async def mark(self, text: str) -> int:
        self.state.marks.append(text)
        return len(self.state.marks)

    @akter.query
    async def marks(self) -> list[str]:
        return self.state.marks

    @akter.workflow
    async def three(wf: akter.Workflow, sku: str, qty: int = 1) -> str:
        """Three command steps."""
        for n in range(3):
            await wf.get(Shop, wf.ref.id).mark(f"{sku} {n}")
        return f"{qty} x {sku}"

    @akter.workflow
    async def waiter(wf: akter.Workflow, n: int) -> list[str]:
        """Take ``n`` notes."""
        got: list[str] = []
        for _ in range(n):
            note = await wf.wait(Note)
            assert note is not None
            got.append(note.text)
        return got

    @akter.workflow
    async def gated(wf: akter.Workflow) -> str:
        """A mark, a wait for Go, a mark."""
        await wf.get(Shop, wf.ref.id).mark("before")
        await wf.wait(Go)
        await wf.get(Shop, wf.ref.id).mark("after")
        return "through"


ACTORS: list[type[akter.Actor[Any]]] = [Shop, Account]


@pytest.fixture(autouse=True)
def _fresh_asks() -> None:
    ASKED.clear()


async def start(
    s: Served, http: httpx.AsyncClient, workflow: str, body: dict[str, Any], actor: str = "s1"
) -> str:
    key = await s.mint(ALICE)
    response = await http.post(
        f"/actors/Shop/{actor}/workflows/{workflow}", json=body, headers={"Idempotency-Key": key}
    )
    assert response.status_code == 200, response.text
    run_id = str(response.json()["run_id"])
    assert run_id.startswith(key + "~")  # the run id derives from the command id
    return run_id


async def status_of(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    response = await http.get(f"/workflows/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def ended(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    return await until(
        lambda: status_of(http, run_id),
        what=f"run {run_id} ended",
        holds=lambda s: s["status"] in ("completed", "failed", "cancelled"),
    )


async def waiting(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    return await until(
        lambda: status_of(http, run_id),
        what=f"run {run_id} suspended",
        holds=lambda s: s["status"] == "suspended",
    )


# --- starting ---------------------------------------------------------------------------------


async def test_start_is_idempotent_by_key_and_status_reads_the_run(served: Serve) -> None:
    async with served(ACTORS) as s:
        http = s.http(ALICE)
        key = await s.mint(ALICE)
        path = "/actors/Shop/s1/workflows/three"
        headers = {"Idempotency-Key": key}
        first = await http.post(path, json={"sku": "tea", "qty": 2}, headers=headers)
        assert first.status_code == 200, first.text
        assert first.headers["content-type"].startswith("application/json")
        run_id = first.json()["run_id"]
        assert run_id.startswith(key + "~")  # the run id derives from the command id
        again = await http.post(path, json={"sku": "tea", "qty": 2}, headers=headers)
        assert again.json() == {"run_id": run_id}
        other = await http.post(path, json={"sku": "tea", "qty": 3}, headers=headers)
        assert_problem(other, 409, "CommandConflict")
        another = await http.post(
            "/actors/Shop/s1/workflows/waiter", json={"n": 1}, headers=headers
        )
        assert_problem(another, 409, "CommandConflict")
        assert await count(s.t, "workflows") == 1
        # Like a command's receipt, a start is idempotent per actor: the same key on another
        # actor starts that actor's own run.
        elsewhere = await http.post(
            "/actors/Shop/s9/workflows/three", json={"sku": "tea", "qty": 2}, headers=headers
        )
        assert elsewhere.status_code == 200, elsewhere.text
        assert elsewhere.json()["run_id"] not in (run_id, key)
        assert await count(s.t, "workflows") == 2

        status = await ended(http, run_id)
        assert status["status"] == "completed"
        assert status["result"] == "2 x tea"
        assert status["error"] is None
        assert status["workflow"] == "three"
        assert status["actor"] == {"tenant": "acme", "type": "Shop", "id": "s1"}
        assert [(st["seq"], st["kind"], st["status"]) for st in status["steps"]] == [
            (0, "command", "done"),
            (1, "command", "done"),
            (2, "command", "done"),
        ]
        # A replayed start after the end answers the same run; the steps ran once.
        assert (await http.post(path, json={"sku": "tea", "qty": 2}, headers=headers)).json() == {
            "run_id": run_id
        }
        marks = await s.t.get(Shop, "s1", tenant="acme").marks()
        assert marks == ["tea 0", "tea 1", "tea 2"]


async def test_start_refusals(served: Serve) -> None:
    async with served(ACTORS) as s:
        http = s.http(ALICE)
        path = "/actors/Shop/s1/workflows/three"

        async def post(body: Any, *, key: str | None = "mint", **kw: Any) -> httpx.Response:
            headers = dict(kw.pop("headers", {}))
            if key == "mint":
                key = await s.mint(ALICE)
            if key is not None:
                headers["Idempotency-Key"] = key
            return await http.post(kw.pop("to", path), json=body, headers=headers, **kw)

        assert_problem(await post({"sku": "x"}, key=None), 400, "InvalidInput")
        assert (await post({"sku": "x"}, key=None)).json()["code"] == "missing_idempotency_key"
        assert_problem(await post({"sku": "x"}, key="nope"), 400, "InvalidCommandId")
        # Strict JSON, as command bodies: no "1" for an int, no true, no unknown fields.
        for body in ({"sku": "x", "qty": "1"}, {"sku": "x", "qty": True}, {"sku": 5}):
            assert_problem(await post(body), 400, "InvalidInput")
        refused = assert_problem(await post({"sku": "x", "color": "red"}), 400, "InvalidInput")
        assert refused.get("field") == "color"
        assert_problem(await post({}), 400, "InvalidInput")
        assert_problem(await post([1]), 400, "InvalidInput")
        assert_problem(await post({"sku": "a\u0000b"}), 400, "InvalidInput")
        nan = await http.post(
            path,
            content=b'{"sku": "x", "qty": NaN}',
            headers={"Idempotency-Key": await s.mint(ALICE), "Content-Type": "application/json"},
        )
        assert_problem(nan, 400, "InvalidInput")
        text = await http.post(
            path,
            content=b'{"sku": "x"}',
            headers={"Idempotency-Key": await s.mint(ALICE), "Content-Type": "text/plain"},
        )
        assert_problem(text, 415, "InvalidInput", "unsupported_media_type")
        assert_problem(
            await post({}, to="/actors/Shop/s1/workflows/nope"),
            404,
            "InvalidInput",
            "unknown_member",
        )
        assert_problem(
            await post({}, to="/actors/Nope/s1/workflows/three"),
            404,
            "InvalidInput",
            "unknown_type",
        )
        huge = await post({"sku": "x" * 1_100_000})
        assert_problem(huge, 413, "InvalidInput", "body_too_large")
        get = await http.get(path)
        assert get.status_code == 405
        assert await count(s.t, "workflows") == 0

        # An actor whose id ends in "/workflows" still takes its commands at that path.
        mark = await post({"text": "hi"}, to="/actors/Shop/x/workflows/mark")
        assert mark.status_code == 200, mark.text
        assert await s.t.get(Shop, "x/workflows", tenant="acme").marks() == ["hi"]


# --- the client -------------------------------------------------------------------------------


async def test_client_starts_runs_and_awaits_results(served: Serve) -> None:
    async with served(ACTORS) as s:
        client = s.client(ALICE)
        shop = client.get(Shop, "s2")
        run = await shop.three.start("jam", qty=4)
        result: str = await run.result(timeout=10)
        assert result == "4 x jam"
        status = await run.status()
        assert status.status == "completed" and len(status.steps) == 3
        assert status.actor == akter.ActorRef("acme", "Shop", "s2")

        # A pinned command id starts one run, however often it is sent.
        cid = await client.mint_command_id()
        pinned = await shop.with_command_id(cid).three.start("oat")
        assert pinned.id.startswith(cid + "~")
        assert (await shop.with_command_id(cid).three.start("oat")).id == pinned.id
        with pytest.raises(akter.ActorError) as conflict:
            await shop.with_command_id(cid).three.start("rye")
        assert conflict.value.reason == "CommandConflict"

        # Signals and cancels through the run handle (and a handle found by id).
        waiter = await shop.waiter.start(2)
        await waiter.signal(Note(text="a"))
        await client.workflow_run(waiter.id).signal(Note(text="b"))
        assert await waiter.result(timeout=10) == ["a", "b"]
        with pytest.raises(akter.ActorError) as finished:
            await waiter.signal(Note(text="late"))
        assert (finished.value.reason, finished.value.code) == ("InvalidInput", "workflow_finished")

        stuck = await shop.waiter.start(1)
        await stuck.cancel()
        with pytest.raises(akter.WorkflowCancelled):
            await stuck.result(timeout=10)
        assert (await client.workflow_run(stuck.id).status()).status == "cancelled"
        await stuck.cancel()  # an ended run stays as it is

        with pytest.raises(akter.ActorError) as unknown:
            await client.workflow_run("v1.1.2.nope").status()
        assert unknown.value.code == "unknown_workflow_run"


# --- signals and cancels over raw HTTP --------------------------------------------------------


async def test_signals_over_http(served: Serve) -> None:
    async with served(ACTORS) as s:
        http = s.http(ALICE)
        run_id = await start(s, http, "waiter", {"n": 2})
        signals = f"/workflows/{run_id}/signals"

        sent = await http.post(f"{signals}/Note", json={"text": "one"})
        assert sent.status_code == 200, sent.text
        assert sent.json() == {"run_id": run_id, "signal": "Note"}

        # Refusals: a name that is no class name, a body that is no object or holds what
        # PostgreSQL cannot store, a body beyond the limit, a malformed key.
        assert_problem(
            await http.post(f"{signals}/not-a-name", json={"text": "x"}),
            400,
            "InvalidInput",
            "invalid_signal",
        )
        assert_problem(await http.post(f"{signals}/Note", json=["x"]), 400, "InvalidInput")
        assert_problem(await http.post(f"{signals}/Note", json="x"), 400, "InvalidInput")
        assert_problem(
            await http.post(f"{signals}/Note", json={"text": "a\u0000b"}),
            400,
            "InvalidInput",
            "invalid_signal",
        )
        nan = await http.post(
            f"{signals}/Note",
            content=b'{"text": NaN}',
            headers={"Content-Type": "application/json"},
        )
        assert_problem(nan, 400, "InvalidInput")
        deep = await http.post(
            f"{signals}/Note",
            content=b"[" * 100_000 + b"]" * 100_000,
            headers={"Content-Type": "application/json"},
        )
        assert_problem(deep, 400, "InvalidInput")
        huge = await http.post(f"{signals}/Note", json={"text": "x" * 1_100_000})
        assert_problem(huge, 413, "InvalidInput", "body_too_large")
        long_key = await http.post(
            f"{signals}/Note", json={"text": "x"}, headers={"Idempotency-Key": "k" * 201}
        )
        assert_problem(long_key, 400, "InvalidInput", "invalid_idempotency_key")
        assert_problem(
            await http.post("/workflows/v1.1.2.nope/signals/Note", json={"text": "x"}),
            404,
            "InvalidInput",
            "unknown_workflow_run",
        )
        assert_problem(
            await http.post("/workflows/a%00b/signals/Note", json={"text": "x"}),
            404,
            "InvalidInput",
            "unknown_workflow_run",
        )
        assert await count(s.t, "workflow_signals") == 1

        # An Idempotency-Key keeps a signal once, however often it is sent.
        key = {"Idempotency-Key": await s.mint(ALICE)}
        for _ in range(2):
            again = await http.post(f"{signals}/Note", json={"text": "two"}, headers=key)
            assert again.status_code == 200, again.text
        status = await ended(http, run_id)
        assert (status["status"], status["result"]) == ("completed", ["one", "two"])
        assert await count(s.t, "workflow_signals") == 2

        late = await http.post(f"{signals}/Note", json={"text": "late"})
        assert_problem(late, 409, "InvalidInput", "workflow_finished")


async def test_cancel_over_http(served: Serve) -> None:
    async with served(ACTORS) as s:
        http = s.http(ALICE)
        run_id = await start(s, http, "waiter", {"n": 1})
        await waiting(http, run_id)
        cancelled = await http.post(f"/workflows/{run_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["run_id"] == run_id
        assert cancelled.json()["cancel_requested"] is True
        status = await ended(http, run_id)
        assert status["status"] == "cancelled"
        assert status["error"]["type"] == "WorkflowCancelled"
        again = await http.post(f"/workflows/{run_id}/cancel")
        assert again.status_code == 200
        assert again.json()["status"] == "cancelled"
        assert_problem(
            await http.post("/workflows/v1.1.2.nope/cancel"),
            404,
            "InvalidInput",
            "unknown_workflow_run",
        )
        assert (await http.get(f"/workflows/{run_id}/cancel")).status_code == 405


# --- the steps feed ---------------------------------------------------------------------------


async def test_steps_feed_follows_a_run_live_and_resumes(served: Serve) -> None:
    async with served(ACTORS) as s:
        http = s.http(ALICE)
        run_id = await start(s, http, "gated", {})
        await waiting(http, run_id)  # the mark is done, the wait for Go pending
        path = f"/workflows/{run_id}/steps"
        async with http.stream("GET", path, timeout=None) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = SseReader(response)
            first, pending = await reader.take(2)
            assert (first.event, first.id) == ("step", "0")
            assert first.json()["kind"] == "command" and first.json()["status"] == "done"
            assert pending.event == "step" and pending.id is None  # resent on resume
            assert (pending.json()["seq"], pending.json()["status"]) == (1, "pending")
            sent = await http.post(f"/workflows/{run_id}/signals/Go", json={})
            assert sent.status_code == 200, sent.text
            rest = await reader.rest()
        steps = [f for f in rest if f.event == "step"]
        # The last mark may be seen pending first: a pending frame has no id, a done one its seq.
        assert [(f.id, f.json()["seq"]) for f in steps if f.json()["status"] == "done"] == [
            ("1", 1),
            ("2", 2),
        ]
        assert all(f.id is None for f in steps if f.json()["status"] == "pending")
        closed = rest[-1]
        assert closed.event == "closed" and closed.id is None
        final = closed.json()
        assert (final["status"], final["result"], final["run_id"]) == (
            "completed",
            "through",
            run_id,
        )
        assert "steps" not in final

        # Resume after seq 0 (the header wins over ?after=), or after the end.
        journal = (await status_of(http, run_id))["steps"]
        for headers, query, seqs in (
            ({"Last-Event-ID": "0"}, "?after=2", [1, 2]),
            ({}, "?after=1", [2]),
            ({"Last-Event-ID": "2"}, "", []),
            ({}, "", [0, 1, 2]),
        ):
            async with http.stream("GET", path + query, headers=headers) as resumed:
                frames = await SseReader(resumed).rest()
            got = [f.json() for f in frames if f.event == "step"]
            assert [g["seq"] for g in got] == seqs
            assert got == [journal[seq] for seq in seqs]
            assert frames[-1].event == "closed"

        assert_problem(
            await http.get(path, headers={"Last-Event-ID": "x"}),
            400,
            "InvalidInput",
            "invalid_cursor",
        )
        assert_problem(await http.get(path + "?after=-1"), 400, "InvalidInput", "invalid_cursor")
        assert_problem(
            await http.get("/workflows/v1.1.2.nope/steps"),
            404,
            "InvalidInput",
            "unknown_workflow_run",
        )


async def test_steps_feed_of_a_quiet_run_stays_open_until_the_client_leaves(served: Serve) -> None:
    async with served(ACTORS) as s:
        http = s.http(ALICE)
        run_id = await start(s, http, "waiter", {"n": 1})
        await waiting(http, run_id)
        async with http.stream("GET", f"/workflows/{run_id}/steps", timeout=None) as response:
            reader = SseReader(response)
            (pending,) = await reader.take(1)
            assert pending.json()["status"] == "pending"
            # Nothing more while the run waits: several polls pass without a frame.
            with pytest.raises(TimeoutError):
                await reader.take(1, within=POLL_FIRST * 8)
        # The client left mid-feed; the run is untouched and the server still answers.
        assert (await status_of(http, run_id))["status"] == "suspended"


# --- access -----------------------------------------------------------------------------------


async def test_access_policy_decides_every_route(served: Serve) -> None:
    async with served(ACTORS) as s:
        alice = s.http(ALICE)
        run_id = await start(s, alice, "waiter", {"n": 1})
        await waiting(alice, run_id)
        assert ("alice", "waiter", "command") in ASKED
        ASKED.clear()
        await status_of(alice, run_id)
        async with alice.stream("GET", f"/workflows/{run_id}/steps") as feed:
            await SseReader(feed).take(1)
        assert ASKED == [("alice", "waiter", "query"), ("alice", "waiter", "query")]

        mallory = s.http(MALLORY)
        key = {"Idempotency-Key": await s.mint(MALLORY)}
        refusals = [
            await mallory.post("/actors/Shop/s1/workflows/waiter", json={"n": 1}, headers=key),
            await mallory.get(f"/workflows/{run_id}"),
            await mallory.post(f"/workflows/{run_id}/signals/Note", json={"text": "x"}),
            await mallory.post(f"/workflows/{run_id}/cancel"),
            await mallory.get(f"/workflows/{run_id}/steps"),
        ]
        for refused in refusals:
            assert_problem(refused, 403, "Unauthorized", "access_denied")
        asked = [(member, kind) for who, member, kind in ASKED if who == "mallory"]
        assert asked == [
            ("waiter", "command"),
            ("waiter", "query"),
            ("waiter", "command"),
            ("waiter", "command"),
            ("waiter", "query"),
        ]

        # Another tenant's run does not exist for the caller; one without credentials (served
        # in the tenant "default") hears "log in", for a run elsewhere as for no run at all.
        anonymous = s.http()
        for response in (
            await anonymous.get(f"/workflows/{run_id}"),
            await anonymous.get("/workflows/v1.1.2.nope"),
            await anonymous.post(f"/workflows/{run_id}/signals/Note", json={"text": "x"}),
        ):
            assert_problem(response, 401, "Unauthorized", "missing_credentials")
        elsewhere = s.http(ALICE_ELSEWHERE)
        for response in (
            await elsewhere.get(f"/workflows/{run_id}"),
            await elsewhere.post(f"/workflows/{run_id}/cancel"),
            await elsewhere.post(f"/workflows/{run_id}/signals/Note", json={"text": "x"}),
        ):
            assert_problem(response, 404, "InvalidInput", "unknown_workflow_run")
        status = await status_of(alice, run_id)
        assert (status["status"], status["cancel_requested"]) == ("suspended", False)
        assert await count(s.t, "workflow_signals") == 0

        # A run of the tenant "default" that the policy refuses to Anonymous: "log in" (401).
        home = s.http(ALICE_AT_HOME)
        key = {"Idempotency-Key": await s.mint(ALICE_AT_HOME)}
        started = await home.post("/actors/Shop/s1/workflows/waiter", json={"n": 1}, headers=key)
        assert started.status_code == 200, started.text
        home_run = started.json()["run_id"]
        for response in (
            await anonymous.get(f"/workflows/{home_run}"),
            await anonymous.post(f"/workflows/{home_run}/cancel"),
        ):
            assert_problem(response, 401, "Unauthorized", "missing_credentials")


# --- the OpenAPI document ---------------------------------------------------------------------


async def test_openapi_documents_the_workflow_routes(served: Serve) -> None:
    async with served(ACTORS) as s:
        document = (await s.http().get("/openapi.json")).json()
        paths = document["paths"]
        start_op = paths["/actors/Shop/{id}/workflows/three"]["post"]
        assert start_op["operationId"] == "Shop.workflow.three"
        assert "Idempotency-Key" in [p["name"] for p in start_op["parameters"]]
        args = start_op["requestBody"]["content"]["application/json"]["schema"]
        assert args == {"$ref": "#/components/schemas/ShopThreeWorkflowArgs"}
        schema = document["components"]["schemas"]["ShopThreeWorkflowArgs"]
        assert set(schema["properties"]) == {"sku", "qty"} and schema["required"] == ["sku"]
        assert "/actors/Account/{id}/workflows/three" not in paths
        for path, method in (
            ("/workflows/{run_id}", "get"),
            ("/workflows/{run_id}/signals/{signal}", "post"),
            ("/workflows/{run_id}/cancel", "post"),
            ("/workflows/{run_id}/steps", "get"),
        ):
            assert method in paths[path], path
        status = paths["/workflows/{run_id}"]["get"]["responses"]["200"]
        ref = status["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/WorkflowStatus"
        assert "steps" in document["components"]["schemas"]["WorkflowStatus"]["properties"]

    async with served([Account]) as s:
        document = (await s.http().get("/openapi.json")).json()
        assert not [p for p in document["paths"] if "workflows" in p]


def test_frames_are_compact_json() -> None:
    # A frame's data is one line: the JSON of a step record holds no raw newline.
    from akter.http._workflows import _frame

    frame = _frame(3, json.dumps({"outcome": "a\nb"}))
    assert frame.count("\n") == 4 and frame.startswith("id: 3\nevent: step\ndata: ")


# --- schemathesis over the workflow routes ----------------------------------------------------


def st_config(document: dict[str, Any], run_id: str) -> str:
    """The API key as the document's scheme; the run routes read one ended run.

    Declared as the ``ApiKeys`` scheme (not a plain header), schemathesis can leave it out to
    check that each operation refuses a request without it. Any run id but the ended run's is a
    documented 404 (or 401 without the key).
    """
    sections = [f'[auth.openapi.ApiKeys]\napi_key = "{st.KEY}"\n']
    for path, item in document["paths"].items():
        if not path.startswith("/workflows/{run_id}"):
            continue
        for method in item:
            sections.append(
                f"[[operations]]\ninclude-name = {json.dumps(f'{method.upper()} {path}')}\n"
                f'parameters = {{ "path.run_id" = "{run_id}" }}\n'
            )
    return "\n".join(sections)


async def test_schemathesis_checks_all_pass_on_workflow_routes(
    served: Serve, tmp_path: Path
) -> None:
    auth = akter.http.ApiKeys({st.KEY: ("alice", "acme")})
    async with served([Shop], auth=auth) as s:
        document = (await s.http().get("/openapi.json")).json()
        shop = s.t.get(Shop, "st-shop", tenant="acme")
        run = await shop.three.start("st")
        await run.result(timeout=10)
        settings = tmp_path / "schemathesis.toml"
        settings.write_text(st_config(document, run.id))
        header = f"X-API-Key: {st.KEY}"
        env = {
            **os.environ,
            "AKTER_ST_URL": s.url,
            "AKTER_ST_HEADER": header,
            "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
            "PYTHONPATH": os.pathsep.join([str(st.ROOT), *map(os.path.abspath, st.PYTHONPATH)]),
        }
        proc = await asyncio.create_subprocess_exec(
            st.ST,
            "--config-file",
            str(settings),
            "run",
            f"{s.url}/openapi.json",
            "--checks",
            "all",
            "--include-path-regex",
            "^/(workflows/|actors/Shop/\\{id\\}/workflows/)",
            "--max-examples",
            st.EXAMPLES,
            "--phases",
            "examples,coverage,fuzzing",
            "--request-timeout",
            "1.5",
            "--workers",
            "1",
            "--seed",
            st.SEED,
            "--no-color",
            "--report-dir",
            str(tmp_path),
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        text = out.decode()
        (tmp_path / "schemathesis.txt").write_text(text)
        assert proc.returncode == 0, text
        # Three starts and four run routes, of 14 (the actor routes include a job's output
        # stream and a command's outcome read).
        assert "7 selected / 14 total" in text, text
        assert "No issues found" in text, text
