"""The console's JSON and SSE routes over a real uvicorn server on a real PostgreSQL.

Each route's JSON is checked against rows the test wrote; the console is off by default; its
401/403 rules, its CSRF defence and its loopback guard refuse before any row is read or written;
retry and discard change the durable rows exactly as ``akter dead-letters retry|discard`` does
(both call :class:`akter.operators.DeadLetters`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

import akter
import akter.http
from akter.errors import ConfigurationError
from akter.http.console import Console, api
from akter.testing import ActorTest
from tests.e2e.conftest import (
    ACTORS,
    OPERATOR,
    SECRET,
    Account,
    Courier,
    CourierControl,
    Registry,
    Serve,
    Served,
    SseReader,
    Vault,
    assert_problem,
    count,
    operators_only,
    token,
)

pytestmark = pytest.mark.timeout(60)

CONSOLE_ACTORS = [*ACTORS, Courier]
HEADER = {"X-Akter-Console": "1"}


def console_app(console: Console | None = None) -> dict[str, Any]:
    return {"console": console or Console(allow=operators_only)}


def operator(s: Served) -> httpx.AsyncClient:
    """A client of the console as the operator, with the page's header."""
    return s.http(token(OPERATOR), headers=HEADER)


async def letters(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.dead_letters ORDER BY job_id")


async def dead_letter(t: ActorTest, actor_id: str, to: str) -> str:
    """Ship a parcel while the depot is closed: its job ends as a dead letter."""
    job_id = await t.get(Courier, actor_id).ship(to)
    await t.drain()
    assert [r["job_id"] for r in await letters(t) if r["job_id"] == job_id] == [job_id]
    return job_id


# --- off by default, and on only with a rule --------------------------------------------------


async def test_the_console_is_off_by_default(served: Serve) -> None:
    async with served(CONSOLE_ACTORS) as s:
        await s.t.get(Account, "a-1", tenant="acme").deposit(5)
        http = s.http(token(OPERATOR), headers=HEADER)
        for path in ("/console", "/console/", "/console/static/console.js", "/console/api/actors"):
            assert_problem(await http.get(path), 404, "InvalidInput", "no_route")
        assert_problem(await http.post("/console/api/dead-letters/x/retry"), 404, "InvalidInput")
        with_console = akter.http.app(
            s.t.runtime, auth=akter.http.BearerJWT(SECRET), console=Console(allow=operators_only)
        )
        # The console adds no operation to the OpenAPI document.
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=with_console), base_url="http://test"
        ) as asgi:
            spec = (await asgi.get("/openapi.json")).json()
        assert spec == (await http.get("/openapi.json")).json()
        assert not any(path.startswith("/console") for path in spec["paths"])


async def test_console_needs_a_console_object_with_a_rule(served: Serve) -> None:
    async with served(CONSOLE_ACTORS) as s:
        with pytest.raises(ConfigurationError, match="Console"):
            akter.http.app(s.t.runtime, console=True)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="callable"):
            Console(allow=True)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="list of origins"):
            Console(allow=operators_only, origins="https://ops.example.com")
        with pytest.raises(ValueError, match="not an origin"):
            Console(allow=operators_only, origins=["ops.example.com"])
        assert Console(allow=operators_only, origins=["HTTPS://Ops.Example.com:443/"]).origins == {
            "https://ops.example.com"
        }
        # Each local console has its own random token, which its repr does not show.
        one, two = Console.local(), Console.local()
        assert one.token and two.token and one.token != two.token and len(one.token) >= 32
        assert one.token not in repr(one)


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(served: Serve) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app()) as s:
        http = s.http()
        moved = await http.get("/console")
        assert moved.status_code == 308 and moved.headers["location"] == "console/"
        page = await http.get("/console/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="static/console.js"' in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-frame-options"] == "DENY"
        script = await http.get("/console/static/console.js")
        assert script.status_code == 200 and "text/javascript" in script.headers["content-type"]
        # The page renders data with textContent only.
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script.text, sink
        assert (await http.get("/console/static/console.css")).status_code == 200
        assert (await http.get("/console/static/index.html")).status_code == 404
        assert (await http.get("/console/static/..%2Fapi.py")).status_code == 404


# --- who may use it ------------------------------------------------------------------------------


async def test_console_refusals_401_403_csrf_and_origin(
    served: Serve, courier: CourierControl
) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        job_id = await dead_letter(s.t, "c-1", "x")
        own = s.url
        anonymous = s.http(headers=HEADER)
        assert_problem(
            await anonymous.get("/console/api/overview"), 401, "Unauthorized", "missing_credentials"
        )
        bob = s.http(token("bob"), headers=HEADER)
        refused = assert_problem(
            await bob.get("/console/api/overview"), 403, "Unauthorized", "console_denied"
        )
        assert "'bob'" in refused["detail"]
        # Without the page's header: refused before the caller is even looked at.
        bare = s.http(token(OPERATOR))
        assert_problem(
            await bare.get("/console/api/overview"), 403, "Unauthorized", "console_header_missing"
        )
        ops = operator(s)
        for headers in (
            {"Origin": "https://evil.example"},
            {"Origin": "null"},
            {"Origin": own.replace(str(urlsplit(own).port), "1")},  # another port
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Site": "cross-site", "Origin": own},  # the browser's verdict wins
        ):
            assert_problem(
                await ops.post(f"/console/api/dead-letters/{job_id}/retry", headers=headers),
                403,
                "Unauthorized",
                "origin_denied",
            )
        # A cross-site form post cannot set the header: the letter stays.
        for client in (bare, anonymous, bob):
            response = await client.post(
                f"/console/api/dead-letters/{job_id}/discard",
                headers={"Origin": own, "Content-Type": "application/x-www-form-urlencoded"},
            )
            assert response.status_code in (401, 403)
        assert [r["job_id"] for r in await letters(s.t)] == [job_id]
        # The operator, same-origin: allowed.
        fine = await ops.get(
            "/console/api/overview", headers={"Origin": own, "Sec-Fetch-Site": "same-origin"}
        )
        assert fine.status_code == 200 and fine.headers["cache-control"] == "no-store"
        # Behind a TLS-terminating proxy the browser's origin is https:// while the app sees
        # http://: Sec-Fetch-Site decides, and without it the scheme is not compared.
        tls = own.replace("http://", "https://")
        for headers in (
            {"Origin": tls, "Sec-Fetch-Site": "same-origin"},
            {"Origin": tls},
            {"Origin": "https://console.example", "Sec-Fetch-Site": "same-origin"},
            {"Sec-Fetch-Site": "none"},  # typed into the address bar
            {},  # not a browser: the header is the defence
        ):
            response = await ops.get("/console/api/overview", headers=headers)
            assert response.status_code == 200, (headers, response.text)


async def test_trusted_origins(served: Serve, courier: CourierControl) -> None:
    trusted = Console(allow=operators_only, origins=["https://ops.example.com"])
    async with served(CONSOLE_ACTORS, app_options=console_app(trusted), relay=False) as s:
        job_id = await dead_letter(s.t, "c-1", "x")
        ops = operator(s)
        for site in ("cross-site", "same-site", None):
            headers = {"Origin": "https://ops.example.com:443"}
            if site:
                headers["Sec-Fetch-Site"] = site
            response = await ops.get("/console/api/overview", headers=headers)
            assert response.status_code == 200, (headers, response.text)
            other = {**headers, "Origin": "https://evil.example.com"}
            assert_problem(
                await ops.get("/console/api/overview", headers=other),
                403,
                "Unauthorized",
                "origin_denied",
            )
        retried = await ops.post(
            f"/console/api/dead-letters/{job_id}/retry",
            headers={"Origin": "https://ops.example.com", "Sec-Fetch-Site": "cross-site"},
        )
        assert retried.status_code == 200, retried.text


async def test_an_async_rule_and_anonymous_callers(served: Serve) -> None:
    seen: list[akter.User | akter.Anonymous] = []

    async def rule(caller: akter.User | akter.Anonymous) -> bool:
        seen.append(caller)
        return isinstance(caller, akter.Anonymous)

    # Anonymous is refused before the rule is asked, unless the console opts in.
    async with served(CONSOLE_ACTORS, auth=None, app_options=console_app(Console(rule))) as s:
        refused = await s.http(headers=HEADER).get("/console/api/overview")
        assert (
            "Anonymous may not use"
            in assert_problem(refused, 403, "Unauthorized", "console_denied")["detail"]
        )
        assert seen == []
    opted_in = console_app(Console(rule, anonymous=True))
    async with served(CONSOLE_ACTORS, auth=None, app_options=opted_in) as s:
        assert (await s.http(headers=HEADER).get("/console/api/overview")).status_code == 200
        assert seen == [akter.Anonymous()]


async def test_the_local_console_needs_its_token_loopback_and_no_proxy(
    served: Serve, courier: CourierControl
) -> None:
    local = Console.local()
    assert local.token is not None
    with_token = {**HEADER, "X-Akter-Console-Token": local.token}
    async with served(CONSOLE_ACTORS, auth=None, app_options=console_app(local)) as s:
        job_id = await dead_letter(s.t, "c-1", "x")
        client = s.http(headers=with_token)
        assert (await client.get("/console/api/overview")).status_code == 200
        # Without the token, or with another: 401, and nothing is read or changed.
        for headers, code in (
            (HEADER, "console_token_missing"),
            ({**HEADER, "X-Akter-Console-Token": ""}, "console_token_missing"),
            ({**HEADER, "X-Akter-Console-Token": local.token[:-1]}, "console_token_invalid"),
            (
                {**HEADER, "X-Akter-Console-Token": Console.local().token or ""},
                "console_token_invalid",
            ),
        ):
            bare = s.http(headers=headers)
            body = assert_problem(
                await bare.get("/console/api/overview"), 401, "Unauthorized", code
            )
            assert "akter dev" in body["detail"]
            assert_problem(
                await bare.post(f"/console/api/dead-letters/{job_id}/discard"),
                401,
                "Unauthorized",
                code,
            )
        assert [r["job_id"] for r in await letters(s.t)] == [job_id]
        # Through a reverse proxy or a tunnel on this machine: refused, even with the token.
        for name in ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP"):
            proxied = await client.post(
                f"/console/api/dead-letters/{job_id}/discard", headers={name: "for=192.0.2.7"}
            )
            body = assert_problem(proxied, 403, "Unauthorized", "console_proxied")
            assert name.lower() in body["detail"]
        assert [r["job_id"] for r in await letters(s.t)] == [job_id]
        # A DNS-rebinding page reaches loopback under its own host name: refused.
        rebound = await client.get("/console/api/overview", headers={"Host": "evil.example"})
        assert_problem(rebound, 403, "Unauthorized", "console_denied")
        # A request from another machine (a client address that is not loopback): refused.
        asgi = akter.http.app(s.t.runtime, console=local)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi, client=("192.0.2.7", 4000)),
            base_url="http://127.0.0.1",
            headers=with_token,
        ) as remote:
            assert_problem(
                await remote.get("/console/api/overview"), 403, "Unauthorized", "console_denied"
            )


async def test_console_statements_have_a_timeout(
    served: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app()) as s:
        await s.t.get(Account, "a-1").deposit(1)
        monkeypatch.setattr(api, "STATEMENT_TIMEOUT_MS", 200)
        table = s.t.substitute("{schema}.actors")
        async with await psycopg.AsyncConnection.connect(s.t.database_url) as blocker:
            await blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            slow = await operator(s).get("/console/api/overview")
            await blocker.rollback()
        body = assert_problem(slow, 504, "Timeout", "console_query_timeout")
        assert "200 ms" in body["detail"]
        # The timeout was the console transaction's own: the pool's connections are unchanged.
        assert (await operator(s).get("/console/api/overview")).status_code == 200
        await s.t.get(Account, "a-1").deposit(1)


# --- reads -----------------------------------------------------------------------------------


async def test_overview_counts_types_and_totals(served: Serve, courier: CourierControl) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        t = s.t
        for tenant, actor_id in (("acme", "a-1"), ("acme", "a-2"), ("globex", "a-1")):
            await t.get(Account, actor_id, tenant=tenant).deposit(10)
        await t.get(Registry).register("first")
        await t.get(Courier, "c-1").remind()  # a timer and an intent
        await t.get(Courier, "c-1").haul(2)  # a job row, never run (relay off)
        body = (await operator(s).get("/console/api/overview")).json()
    by_type = {entry["type"]: entry for entry in body["types"]}
    assert [entry["type"] for entry in body["types"]] == sorted(by_type)
    assert by_type["Account"] == {
        "type": "Account",
        "hosted": True,
        "singleton": False,
        "actors": 3,
        "tenants": 2,
        "capped": False,
    }
    assert by_type["Registry"]["singleton"] is True and by_type["Registry"]["actors"] == 1
    assert by_type["Vault"]["actors"] == 0 and "tenants" not in by_type["Vault"]
    assert by_type["Courier"]["actors"] == 1
    assert (body["outbox"], body["jobs"], body["dead_letters"]) == (2, 1, 0)
    assert body["capped"] == {"outbox": False, "jobs": False, "dead_letters": False}
    assert body["count_cap"] == api.COUNT_CAP == 10_000


async def test_overview_counts_stop_at_the_cap(
    served: Serve, courier: CourierControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "COUNT_CAP", 2)
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        for actor_id in ("a-1", "a-2", "a-3"):
            await s.t.get(Account, actor_id).deposit(10)
        for _ in range(3):
            await s.t.get(Courier, "c-1").haul(2)
        body = (await operator(s).get("/console/api/overview")).json()
    by_type = {entry["type"]: entry for entry in body["types"]}
    # At most cap + 1 actor rows were read: the counts are lower bounds, marked capped.
    assert sum(entry["actors"] for entry in body["types"]) <= 3
    assert all(entry["capped"] for entry in body["types"])
    assert by_type["Account"]["actors"] <= 2
    assert (body["jobs"], body["capped"]["jobs"]) == (2, True)
    assert (body["outbox"], body["capped"]["outbox"]) == (0, False)
    assert body["count_cap"] == 2


async def test_actors_of_a_type_are_paged_by_tenant_and_id(served: Serve) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app()) as s:
        t = s.t
        for tenant, actor_id in (("acme", "b"), ("acme", "a"), ("globex", "a"), ("acme", "c")):
            await t.get(Account, actor_id, tenant=tenant).deposit(1)
        await t.get(Account, "a", tenant="acme").deposit(1)
        ops = operator(s)
        first = (
            await ops.get("/console/api/actors", params={"type": "Account", "limit": 2})
        ).json()
        assert first["type"] == "Account"
        assert [(a["tenant"], a["id"]) for a in first["actors"]] == [("acme", "a"), ("acme", "b")]
        assert first["actors"][0]["version"] == 2 and first["actors"][0]["event_seq"] == 2
        assert first["actors"][0]["created"] is True and first["actors"][0]["updated_at"]
        second = (
            await ops.get(
                "/console/api/actors",
                params={"type": "Account", "limit": 2, "after": first["next"]},
            )
        ).json()
        assert [(a["tenant"], a["id"]) for a in second["actors"]] == [
            ("acme", "c"),
            ("globex", "a"),
        ]
        assert second["next"] is None
        acme = (
            await ops.get("/console/api/actors", params={"type": "Account", "tenant": "globex"})
        ).json()
        assert [(a["tenant"], a["id"]) for a in acme["actors"]] == [("globex", "a")]
        empty = (await ops.get("/console/api/actors", params={"type": "Vault"})).json()
        assert empty == {"type": "Vault", "actors": [], "next": None}
        assert_problem(
            await ops.get("/console/api/actors", params={"type": "Nope"}),
            404,
            "InvalidInput",
            "unknown_type",
        )
        assert_problem(await ops.get("/console/api/actors"), 400, "InvalidInput")
        for bad in ({"limit": "0"}, {"limit": "501"}, {"limit": "x"}, {"after": "%%%"}):
            response = await ops.get("/console/api/actors", params={"type": "Account", **bad})
            assert_problem(response, 400, "InvalidInput")


async def test_an_actor_shows_state_events_and_outbox(
    served: Serve, courier: CourierControl
) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        t = s.t
        account = t.get(Account, "a-1", tenant="acme")
        await account.deposit(30, "rent")
        await account.deposit(12)
        job_id = await t.get(Courier, "c-1").haul(3)
        await t.get(Vault, "v-1", tenant="acme").put(7)
        ops = operator(s)
        params = {"type": "Account", "id": "a-1", "tenant": "acme"}
        body = (await ops.get("/console/api/actor", params=params)).json()
        rows = await t.rows(
            "SELECT version, event_seq, state FROM {schema}.actors WHERE actor_id = 'a-1'"
        )
        assert body["ref"] == {"tenant": "acme", "type": "Account", "id": "a-1"}
        assert body["exists"] is True and body["created"] is True
        assert (body["version"], body["event_seq"]) == (rows[0]["version"], rows[0]["event_seq"])
        assert (
            body["state"]
            == rows[0]["state"]
            == {
                "balance": 42,
                "callers": ["System", "System"],
                "memos": ["rent"],
            }
        )
        assert body["receipts"] == 2
        assert (body["state_version"], body["code_state_version"]) == (0, 0)
        assert [(e["cursor"], e["tag"], e["event"]) for e in body["events"]] == [
            ("2", "e2e.Deposited", {"cents": 12, "balance": 42}),
            ("1", "e2e.Deposited", {"cents": 30, "balance": 30}),
        ]
        assert body["outbox"] == []

        courier_body = (
            await ops.get("/console/api/actor", params={"type": "Courier", "id": "c-1"})
        ).json()
        assert [
            (o["id"], o["role"], o["command"], o["attempts"]) for o in courier_body["outbox"]
        ] == [(job_id, "job", "trek", 0)]
        # The console reads actors whose access policy refuses every HTTP caller.
        vault = (
            await ops.get(
                "/console/api/actor", params={"type": "Vault", "id": "v-1", "tenant": "acme"}
            )
        ).json()
        assert vault["state"]["balance"] == 7
        singleton = await ops.get("/console/api/actor", params={"type": "Registry", "id": "_"})
        assert singleton.json()["ref"] == {"tenant": "default", "type": "Registry", "id": ""}
        missing = (
            await ops.get("/console/api/actor", params={"type": "Account", "id": "zz"})
        ).json()
        assert missing["exists"] is False and missing["state"] is None and missing["events"] == []
        bad_id = await ops.get("/console/api/actor", params={"type": "Account", "id": ""})
        assert_problem(bad_id, 400, "InvalidInput")


async def test_outbox_and_jobs_list_pending_rows(served: Serve, courier: CourierControl) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        t = s.t
        await t.get(Courier, "c-1", tenant="acme").remind()
        job_id = await t.get(Courier, "c-2").haul(2)
        ops = operator(s)
        outbox = (await ops.get("/console/api/outbox")).json()["outbox"]
        assert sorted((o["role"], o["command"], o["target"]["type"]) for o in outbox) == [
            ("intent", "deposit", "Account"),
            ("timer", "ship", "Courier"),
        ]
        timer = next(o for o in outbox if o["role"] == "timer")
        assert timer["sender"] == {"tenant": "acme", "type": "Courier", "id": "c-1"}
        assert timer["timer_key"] == "reminder" and timer["attempts"] == 0
        intent = next(o for o in outbox if o["role"] == "intent")
        assert timer["due_at"] > intent["due_at"]  # an hour away; the intent is due now
        first = (await ops.get("/console/api/outbox?limit=1")).json()["outbox"]
        assert [o["id"] for o in first] == [intent["id"]]
        jobs = (await ops.get("/console/api/jobs")).json()["jobs"]
        assert [(j["job_id"], j["job"], j["status"], j["attempts"]) for j in jobs] == [
            (job_id, "trek", "pending", 0)
        ]
        assert jobs[0]["ref"] == {"tenant": "default", "type": "Courier", "id": "c-2"}
        rows = await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'job'")
        assert [r["intent_id"] for r in rows] == [job_id]


# --- live feeds --------------------------------------------------------------------------------


async def test_the_event_feed_follows_new_commits(served: Serve) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app()) as s:
        t = s.t
        account = t.get(Account, "a-1", tenant="acme")
        await account.deposit(5)
        ops = operator(s)
        params = {"type": "Account", "id": "a-1", "tenant": "acme", "after": "1"}
        async with ops.stream("GET", "/console/api/actor/events", params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = SseReader(response)
            await account.deposit(7)
            (frame,) = await reader.take(1)
        assert (frame.event, frame.id) == ("e2e.Deposited", "2")
        assert frame.json()["event"] == {"cents": 7, "balance": 12}
        bad = await ops.get("/console/api/actor/events", params={**params, "after": "x"})
        assert_problem(bad, 400, "UnknownCursor")
        refused = s.http(token("bob"), headers=HEADER)
        assert_problem(
            await refused.get("/console/api/actor/events", params=params),
            403,
            "Unauthorized",
            "console_denied",
        )


async def test_the_progress_feed_shows_frames_then_the_close(
    served: Serve, courier: CourierControl
) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app()) as s:
        job_id = await s.t.get(Courier, "c-1").haul(2)
        params = {"type": "Courier", "id": "c-1", "job_id": job_id}
        async with operator(s).stream("GET", "/console/api/jobs/progress", params=params) as r:
            assert r.status_code == 200
            reader = SseReader(r)
            courier.permits.put_nowait(None)
            (first,) = await reader.take(1, within=10)
            assert first.event == "progress"
            assert first.json()["frame"] == {"done": 1, "total": 2, "message": "leg 1"}
            courier.permits.put_nowait(None)
            rest = await reader.rest(within=10)
        assert rest[-1].event == "closed" and rest[-1].json()["closed"] is True
        assert [f.json()["frame"]["done"] for f in rest[:-1]] in ([2], [])
        await s.t.drain()
        assert (await s.t.inspect(s.t.get(Courier, "c-1"))).state == {
            "balance": 2,
            "callers": [],
            "memos": [],
        }


# --- operations ----------------------------------------------------------------------------------


async def test_retry_and_discard_change_the_rows_like_the_cli(
    served: Serve, courier: CourierControl
) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        t = s.t
        first = await dead_letter(t, "c-1", "north")
        second = await dead_letter(t, "c-2", "south")
        ops = operator(s)
        listed = (await ops.get("/console/api/dead-letters")).json()["dead_letters"]
        assert sorted(d["job_id"] for d in listed) == sorted([first, second])
        letter = next(d for d in listed if d["job_id"] == first)
        assert letter["ref"] == {"tenant": "default", "type": "Courier", "id": "c-1"}
        assert (letter["job"], letter["attempts"], letter["ambiguous"]) == ("deliver", 1, False)
        assert letter["cause"] == "JobFailure: the depot is closed"
        assert letter["payload"] == {"to": "north", "steps": 0}
        before = (await letters(t))[[r["job_id"] for r in await letters(t)].index(first)]

        retried = await ops.post(f"/console/api/dead-letters/{first}/retry")
        assert retried.status_code == 200, retried.text
        new_id = retried.json()["new_job_id"]
        assert retried.json()["job_id"] == first and new_id != first
        # As DeadLetters.retry (the CLI's): the letter is gone, a new job row is due with its
        # payload, not maybe_applied (the letter was not ambiguous), never attempted.
        assert [r["job_id"] for r in await letters(t)] == [second]
        (row,) = await t.rows(
            "SELECT intent_id, kind, command, payload, attempts, maybe_applied, actor_id, "
            "routing_key FROM {schema}.outbox"
        )
        assert row["intent_id"] == new_id and row["kind"] == "job" and row["command"] == "deliver"
        payload = row["payload"]
        assert (json.loads(payload) if isinstance(payload, str) else payload) == letter["payload"]
        assert row["attempts"] == 0 and row["maybe_applied"] is False
        assert (row["actor_id"], row["routing_key"]) == ("c-1", before["routing_key"])
        again = await ops.post(f"/console/api/dead-letters/{first}/retry")
        assert_problem(again, 400, "InvalidInput", "unknown_dead_letter")

        courier.fail = False
        await t.drain()
        state = (await t.inspect(t.get(Courier, "c-1"))).state
        assert state is not None and state["memos"] == ["delivered to north"]

        discarded = await ops.post(f"/console/api/dead-letters/{second}/discard")
        assert discarded.status_code == 200, discarded.text
        assert discarded.json()["discarded"]["job_id"] == second
        assert await letters(t) == []
        assert await count(t, "outbox") == 0
        assert_problem(
            await ops.post(f"/console/api/dead-letters/{second}/discard"),
            400,
            "InvalidInput",
            "unknown_dead_letter",
        )
        # Reads are GET only; operations are POST only.
        assert (await ops.get(f"/console/api/dead-letters/{second}/retry")).status_code == 405


async def test_concurrent_retries_of_one_letter_make_one_job(
    served: Serve, courier: CourierControl
) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app(), relay=False) as s:
        job_id = await dead_letter(s.t, "c-1", "east")
        ops = operator(s)
        responses = await asyncio.gather(
            *(ops.post(f"/console/api/dead-letters/{job_id}/retry") for _ in range(4))
        )
        assert sorted(r.status_code for r in responses) == [200, 400, 400, 400]
        assert await letters(s.t) == []
        assert await count(s.t, "outbox", "kind = 'job'") == 1
