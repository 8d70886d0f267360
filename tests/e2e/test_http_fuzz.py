"""Property-based fuzzing of the HTTP surface, driven by the server's own ``/openapi.json``.

Hypothesis builds requests for every operation of the document: bodies from each operation's
JSON schema (valid ones, mutated ones and arbitrary JSON), path ids, Idempotency-Key,
Last-Event-ID, Content-Type and credentials. Properties, for every generated request:

* the server never answers 5xx;
* a refused request (4xx other than a declared error's 422) changes no durable row, and a
  refused command leaves no receipt under its key;
* an accepted command (200) leaves exactly one receipt under its key.

Hypothesis runs in a worker thread with a blocking httpx client, while the server and the
runtime keep running in the test's event loop. The runtime has no relay and executes no jobs,
so nothing changes rows behind the fuzzer's back.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import psycopg_pool.base
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import akter.errors
from tests.e2e.conftest import Serve, Served, token

pytestmark = pytest.mark.timeout(90)

ALICE = token("alice")
#: Examples per run; raise it locally with AKTER_E2E_FUZZ_EXAMPLES (and a random search with
#: AKTER_E2E_FUZZ_RANDOM=1) to search further than CI does.
EXAMPLES = int(os.environ.get("AKTER_E2E_FUZZ_EXAMPLES", "400"))
RANDOM = os.environ.get("AKTER_E2E_FUZZ_RANDOM") == "1"

JSONValue = Any
Schema = dict[str, Any]

# --- JSON values and JSON-schema strategies ---------------------------------------------------

#: Code points that storage and encoders tend to choke on, made likely in every string.
SPECIALS = ["\x00", "\ud800", "\udfff", "\u2028", "\ufeff", "\x7f", "\\", '"', "é", "💸"]


def texts(min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Strings of ordinary text with special code points spliced in (lengths in characters)."""
    pieces = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(SPECIALS)), max_size=6)
    return pieces.map("".join).filter(lambda t: min_size <= len(t) <= max_size)


json_scalars: st.SearchStrategy[JSONValue] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    texts(),
)
any_json: st.SearchStrategy[JSONValue] = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(texts(max_size=10), inner, max_size=4),
    ),
    max_leaves=12,
)


def from_schema(schema: Schema, components: Schema, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values valid for the subset of JSON Schema that pydantic emits (loosely, at depth)."""
    if depth > 4:
        return json_scalars
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(components[name], components, depth + 1))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, components, depth + 1) for s in schema[key]])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return from_schema(schema["allOf"][0], components, depth + 1)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, components, depth) for k in kind])
    if kind == "integer":
        low = schema.get("minimum")
        high = schema.get("maximum")
        if "exclusiveMinimum" in schema:
            low = math.floor(schema["exclusiveMinimum"]) + 1
        if "exclusiveMaximum" in schema:
            high = math.ceil(schema["exclusiveMaximum"]) - 1
        return st.integers(min_value=low, max_value=high)
    if kind == "number":
        return st.floats(
            min_value=schema.get("minimum"),
            max_value=schema.get("maximum"),
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "string":
        return texts(schema.get("minLength", 0), min(schema.get("maxLength", 40), 40))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), components, depth + 1)
        low = schema.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=max(low, min(schema.get("maxItems", 4), 4)))
    if kind == "object" or "properties" in schema:
        properties: dict[str, Schema] = schema.get("properties", {})
        required = set(schema.get("required", []))
        fixed = {
            k: from_schema(v, components, depth + 1) for k, v in properties.items() if k in required
        }
        optional = {
            k: from_schema(v, components, depth + 1)
            for k, v in properties.items()
            if k not in required
        }
        extra = schema.get("additionalProperties", True)
        base = st.fixed_dictionaries(fixed, optional=optional)
        if extra is False:
            return base
        values = any_json if extra is True else from_schema(extra, components, depth + 1)
        more = st.dictionaries(texts(max_size=8), values, max_size=3)
        return st.builds(lambda a, b: {**b, **a}, base, more)
    return any_json


@st.composite
def bodies(draw: st.DrawFn, schema: Schema, components: Schema) -> JSONValue:
    """A valid body, a mutated one (a field dropped, added or of any type) or any JSON."""
    kind = draw(mostly("valid", "drop", "extra", "retype", "any", weight=5))
    if kind == "any":
        return draw(any_json)
    body = draw(from_schema(schema, components))
    if not isinstance(body, dict):
        return body
    if kind == "drop" and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    elif kind == "extra":
        body[draw(texts(1, 8))] = draw(any_json)
    elif kind == "retype" and schema.get("properties"):
        body[draw(st.sampled_from(sorted(schema["properties"])))] = draw(any_json)
    return body


# --- operations of the OpenAPI document ------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    body: Schema | None
    headers: frozenset[str]

    @property
    def is_command(self) -> bool:
        return "Idempotency-Key" in self.headers


def operations(document: Schema) -> list[Operation]:
    found: list[Operation] = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            content = op.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            headers = frozenset(p["name"] for p in op.get("parameters", []) if p["in"] == "header")
            found.append(Operation(method.upper(), path, schema, headers))
    return found


#: Header values httpx can put on the wire (visible ASCII, no surrounding blanks).
header_text = (
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=60)
    .map(str.strip)
    .filter(bool)
)


@dataclass
class Sent:
    op: Operation
    status: int
    key: str | None
    text: str


MINT = "<mint a fresh command id>"


def mostly(usual: str, *others: str, weight: int = 8) -> st.SearchStrategy[str]:
    """``usual`` about ``weight`` times as often as each of ``others``."""
    return st.sampled_from([usual] * weight + list(others))


@st.composite
def requests_for(
    draw: st.DrawFn, ops: list[Operation], components: Schema, hostile: bool
) -> tuple[Operation, str, dict[str, str], bytes | None]:
    """One request: a well-formed envelope around a schema body, or (``hostile``) anything.

    Hostile requests are still mostly well-formed, so refusals are tried at every depth.
    """
    op = draw(st.sampled_from(ops))
    headers: dict[str, str] = {}
    content: bytes | None = None
    if not hostile:
        headers = {"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"}
        if op.is_command:
            headers["Idempotency-Key"] = MINT
        actor_id = "_" if "/Registry/" in op.path else draw(st.sampled_from(["f1", "f2"]))
        body = None if op.body is None else draw(bodies(op.body, components))
        if op.method != "GET":
            content = json.dumps(body).encode()
        return op, op.path.replace("{id}", actor_id), headers, content
    id_kind = draw(mostly("known", "any text", "ascii", weight=6))
    if id_kind == "known":
        actor_id = draw(st.sampled_from(["_", "f1", "f2"]))
    elif id_kind == "any text":
        actor_id = draw(texts(1, 20))
    else:
        actor_id = draw(st.text(st.characters(codec="ascii"), max_size=300))
    path = op.path.replace("{id}", quote(actor_id.encode("utf-8", "surrogatepass"), safe=""))
    auth = draw(mostly("alice", "none", "garbage", "other tenant", weight=12))
    if auth == "alice":
        headers["Authorization"] = f"Bearer {ALICE}"
    elif auth == "other tenant":
        headers["Authorization"] = f"Bearer {token('zed', 'globex')}"
    elif auth == "garbage":
        headers["Authorization"] = "Bearer " + draw(header_text)
    if op.is_command:
        key = draw(mostly("mint", "text", "absent", weight=10))
        if key == "mint":
            headers["Idempotency-Key"] = MINT  # minted when sent, not while drawing
        elif key == "text":
            headers["Idempotency-Key"] = draw(header_text)
    if "Last-Event-ID" in op.headers and draw(st.booleans()):
        headers["Last-Event-ID"] = draw(st.one_of(st.integers(-3, 30).map(str), header_text))
    if op.method == "POST":
        headers["Content-Type"] = draw(
            mostly(
                "application/json",
                "application/json; charset=utf-8",
                "text/plain",
                "application/x-json",
                "",
                weight=16,
            )
        )
        if op.body is not None:
            content = json.dumps(draw(bodies(op.body, components))).encode()
        else:
            content = draw(st.one_of(st.just(b""), any_json.map(lambda v: json.dumps(v).encode())))
        if draw(mostly("json", "bytes", weight=30)) == "bytes":
            content = draw(st.binary(max_size=64))
    return op, path, headers, content


# --- the property -------------------------------------------------------------------------------

FINGERPRINT = """
SELECT (SELECT count(*) FROM {schema}.receipts) AS receipts,
       (SELECT count(*) FROM {schema}.events) AS events,
       (SELECT count(*) FROM {schema}.outbox) AS outbox,
       (SELECT count(*) FROM {schema}.actors) AS actors,
       (SELECT coalesce(sum(version), 0) FROM {schema}.actors) AS versions,
       (SELECT count(*) FROM {schema}.dead_letters) AS letters
"""


def fuzz(s: Served, hostile: bool) -> list[Sent]:
    """Run the Hypothesis search (blocking; call it in a worker thread)."""
    sent: list[Sent] = []
    with (
        httpx.Client(base_url=s.url, timeout=20) as http,
        psycopg.connect(s.t.database_url, autocommit=True) as db,
    ):
        document = http.get("/openapi.json").json()
        ops = operations(document)
        assert len(ops) >= 20
        components = document.get("components", {}).get("schemas", {})
        fingerprint_sql = s.t.substitute(FINGERPRINT)
        receipt_sql = s.t.substitute("SELECT count(*) FROM {schema}.receipts WHERE command_id = %s")

        def fingerprint() -> tuple[Any, ...]:
            row = db.execute(fingerprint_sql).fetchone()
            assert row is not None
            return tuple(row)

        def mint() -> str:
            response = http.post("/command-ids", headers={"Authorization": f"Bearer {ALICE}"})
            assert response.status_code == 200
            return str(response.json()["command_id"])

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=not RANDOM,
            # Shrinking replays requests against the live server for minutes: report the first
            # failing request as found (it is printed in full) and stop.
            phases=[Phase.generate],
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(requests_for(ops, components, hostile))
        def one_request(request: tuple[Operation, str, dict[str, str], bytes | None]) -> None:
            op, path, drawn, content = request
            headers = {k: mint() if v == MINT else v for k, v in drawn.items()}
            before = fingerprint()
            if op.method == "GET":
                with http.stream("GET", path, headers=headers) as response:
                    status = response.status_code
                    text = "" if status == 200 else response.read().decode(errors="replace")
            else:
                response = http.request(op.method, path, headers=headers, content=content)
                status, text = response.status_code, response.text
            key = headers.get("Idempotency-Key")
            sent.append(Sent(op, status, key, text))
            shown = {k: "<redacted>" if k == "Authorization" else v for k, v in headers.items()}
            where = f"{op.method} {path} {shown} {content!r:.300} -> {status} {text:.300}"
            assert status < 500, where
            if 400 <= status < 500 and status != 422:
                assert fingerprint() == before, where
                if key is not None:
                    count = db.execute(receipt_sql, (key,)).fetchone()
                    assert count is not None and count[0] == 0, where
            if status == 200 and op.is_command and key is not None:
                count = db.execute(receipt_sql, (key,)).fetchone()
                assert count is not None and count[0] == 1, where

        one_request()
    return sent


@pytest.mark.parametrize("hostile", [False, True], ids=["schema-bodies", "hostile-envelope"])
async def test_fuzzed_requests_never_fail_the_server_or_write_when_refused(
    served: Serve, monkeypatch: pytest.MonkeyPatch, hostile: bool
) -> None:
    # Hypothesis refuses strategies that touch the global `random` state, and the server (in
    # the main thread) draws jitter from it concurrently: give the server a private generator.
    private = random.Random(0)
    monkeypatch.setattr(akter.errors, "random", private)
    monkeypatch.setattr(psycopg_pool.base, "random", private.random)
    async with served(relay=False, jobs=[]) as s:
        sent = await asyncio.to_thread(fuzz, s, hostile)
    # The search reached accepted commands, queries, feeds and refusals alike.
    statuses = {x.status for x in sent}
    assert {200, 400}.issubset(statuses), statuses
    if hostile:
        assert {401, 404, 415}.issubset(statuses), statuses
    assert sum(x.status == 200 and x.op.is_command for x in sent) >= 10
    assert any(x.status == 200 and "/queries/" in x.op.path for x in sent)
    assert any(x.status == 200 and x.op.path.endswith("/events") for x in sent)
