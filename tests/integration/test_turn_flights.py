"""The turn's five statements (issue 13).

One clock per turn, the release check's bound, and a relay delivery validated once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any, cast

import psycopg
import pytest
from pydantic import AfterValidator, BaseModel

import akter
from akter._ids import parse_command_id, payload_hash
from akter._store.pipeline import _converted
from akter.testing import ActorTest
from tests._support.barriers import until_pending
from tests.integration.actors import ALL, Counter

#: Every test runs with warm turns in one flight and in two (rule 7 of one-flight-turn.md).
pytestmark = pytest.mark.usefixtures("turn_mode")

Make = Callable[..., ActorTest]

VALIDATED: list[int] = []


def _seen(k: int) -> int:
    VALIDATED.append(k)
    return k


class FlightSinkState(BaseModel):
    got: list[int] = []


class FlightSink(akter.Actor[FlightSinkState]):
    @akter.command
    async def put(self, k: Annotated[int, AfterValidator(_seen)]) -> int:
        self.state.got.append(k)
        return len(self.state.got)


class FlightSender(akter.Actor[FlightSinkState]):
    @akter.command
    async def forward(self, k: int) -> int:
        self.send(FlightSink.put, "sink", k)
        return k


async def test_a_relative_delay_counts_from_the_turns_clock(akter_test: Make) -> None:
    # insert_outbox gets the commit's clock as a parameter, bounded from the turn's one reading
    # (admission_read's, which update_actor stamps the row with): from that clock plus the delay,
    # never before it, and no further than the turn lasted.
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "clock")
        before = await t.now_ms()
        await counter.stage_everything(1)
        after = await t.now_ms()
        actor = await t.rows("SELECT updated_at_ms FROM {schema}.actors WHERE actor_id = 'clock'")
        timer = await t.rows(
            "SELECT due_at_ms, scheduled_at_ms FROM {schema}.outbox WHERE timer_key = 'remind'"
        )
        now = int(actor[0]["updated_at_ms"])
        due = int(timer[0]["due_at_ms"])
        assert before <= now <= after
        assert now + 60_000 <= due <= after + 1 + 60_000
        assert int(timer[0]["scheduled_at_ms"]) == due


async def test_the_release_check_refuses_an_id_that_expired_during_the_turn(
    akter_test: Make,
) -> None:
    # No clock statement after COMMIT: the release check bounds the clock from the turn's
    # (plus a test offset moved meanwhile). The commit landed; the caller is told expired.
    async with akter_test(ALL, retry_window=60) as t:
        counter = t.get(Counter, "late")
        cid = await t.runtime.mint_command_id()
        pause = t.pause_next("before_commit")
        call = asyncio.create_task(counter.with_command_id(cid).add(1))
        await pause.wait()
        await t.advance(61)
        pause.release()
        with pytest.raises(akter.ActorError) as exc:
            await call
        assert exc.value.reason == "CommandExpired"
        row = await t.inspect(counter)
        assert row.state is not None and row.state["n"] == 1
        assert [r["command_id"] for r in row.receipts] == [cid]
        # A retry replays the receipt, and the release check refuses it again.
        with pytest.raises(akter.ActorError) as again:
            await counter.with_command_id(cid).add(1)
        assert again.value.reason == "CommandExpired"
        assert (await t.inspect(counter)).version == row.version


async def test_an_unexpired_id_is_released(akter_test: Make) -> None:
    async with akter_test(ALL, retry_window=60) as t:
        counter = t.get(Counter, "early")
        cid = await t.runtime.mint_command_id()
        pause = t.pause_next("before_commit")
        call = asyncio.create_task(counter.with_command_id(cid).add(2))
        await pause.wait()
        await t.advance(30)
        pause.release()
        assert await call == 2


async def test_a_relay_delivery_validates_its_payload_once(akter_test: Make) -> None:
    # Staging validates the arguments (send), the relay's decode validates the stored payload,
    # and the turn turns it into the handler's arguments: three, not the four of a second
    # validation in the delivery path.
    async with akter_test([FlightSink, FlightSender]) as t:
        VALIDATED.clear()
        assert await t.get(FlightSender, "s").forward(7) == 7
        staged = len(VALIDATED)
        await t.drain()
        assert (await t.inspect(t.get(FlightSink, "sink"))).state == {"got": [7]}
        assert len(VALIDATED) - staged == 2


async def test_the_turn_statements_keep_one_plan_per_connection(akter_test: Make) -> None:
    # The receipt probe and insert_outbox take arrays: under plan_cache_mode auto, their generic
    # plan is costed for 100 elements against 1 in a custom plan, and PostgreSQL planned them
    # afresh on every turn (more server time than running them). The turn's settings keep the
    # generic plan for the statements after the lock; the lock statement itself follows auto
    # (at most 5 custom plans before the generic one).
    async with akter_test(ALL, relay=False, pool_size=1) as t:
        if t.on_citus:
            pytest.skip("Citus plans a statement for its parameters (shard pruning): auto stays")
        counter = t.get(Counter, "plans")
        for k in range(12):
            await counter.stage_everything(k)
            await counter.add(k)
        async with t.runtime._store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            rows = cast(list[tuple[str, int, int]], await cur.fetchall())
            plans = {text: (generic, custom) for text, generic, custom in rows}
            mode = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
    queries = t.runtime._store.queries

    def plan(name: str) -> tuple[int, int]:
        return plans[_converted(queries[name], True)[0].decode()]

    assert plan("insert_outbox") == (12, 0)
    assert plan("update_actor_receipt") == (24, 0)
    # The lock statement passes its command ids to the probe's function, whose own plan follows
    # the turn's settings (test_the_receipt_probe_reads_the_key_whatever_the_statistics).
    assert plan("lock_admit")[1] <= 5
    assert all(custom <= 5 for _, custom in plans.values()), plans
    # Transaction-local: the session's own mode is left as it was.
    assert mode == ("auto",)


_TURN_SETTINGS = (
    "plan_cache_mode",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "transaction_timeout",  # PostgreSQL 17 and later; NULL before
)


async def _session_settings(conn: Any) -> list[str | None]:
    cur = await conn.execute(
        "SELECT current_setting(name, true) FROM unnest(%s::text[]) AS name", [list(_TURN_SETTINGS)]
    )
    return [row[0] for row in await cur.fetchall()]


async def test_the_turns_settings_end_with_its_transaction_however_it_ends(
    akter_test: Make,
) -> None:
    # The lock statement sets the turn's timeouts and plan mode for its transaction only. One
    # pooled connection runs a commit, a defect (rolled back, the connection kept), a replay
    # (nothing to write: rolled back) and a declared error (committed): after each, the
    # session's settings are the ones it had before any turn.
    async with akter_test(ALL, relay=False, pool_size=1) as t:
        pool = t.runtime._store.pool
        async with pool.connection() as conn:
            before = await _session_settings(conn)
            backend = conn.info.backend_pid
        counter = t.get(Counter, "settings")
        cid = await t.runtime.mint_command_id()
        turns: list[tuple[str, Callable[[], Any]]] = [
            ("commit", lambda: counter.with_command_id(cid).add(1)),
            ("defect", lambda: counter.defect("boom")),
            ("replay", lambda: counter.with_command_id(cid).add(1)),
            ("declared", lambda: counter.take(10**6)),
        ]
        for what, call in turns:
            try:
                await call()
            except akter.ActorError as exc:
                assert (what, exc.reason) == ("defect", "Defect"), exc
            except akter.DeclaredError:
                assert what == "declared"
            else:
                assert what in ("commit", "replay")
            async with pool.connection() as conn:
                assert conn.info.backend_pid == backend, what  # the turn's own connection
                assert await _session_settings(conn) == before, what
        state = (await t.inspect(counter)).state
        assert state is not None and state["n"] == 1


_FILL_RECEIPTS = """
INSERT INTO {schema}.receipts
    (routing_key, tenant_id, actor_type, actor_id, command_id, command, payload_hash,
     caller_key, outcome, expires_at_ms)
SELECT a.routing_key, a.tenant_id, a.actor_type, a.actor_id, 'fill-' || g, 'add', repeat('0', 64),
       'local-anonymous', '{"ok": 1}', 1764900000000 + g
FROM {schema}.actors a CROSS JOIN generate_series(1, %(n)s) AS g
WHERE a.actor_id = %(id)s
"""


def _scans(plan: dict[str, Any]) -> Iterator[tuple[str | None, str | None]]:
    if plan.get("Relation Name") == "receipts":
        yield plan["Node Type"], plan.get("Index Name")
    for child in plan.get("Plans", []):
        yield from _scans(child)


@pytest.mark.parametrize("probe", ["admission_receipts", "admission_read"])
@pytest.mark.parametrize("analyzed", [False, True], ids=["never_analyzed", "analyzed_at_1_row"])
async def test_the_receipt_probe_reads_the_key_whatever_the_statistics(
    akter_test: Make, akter_db: str, analyzed: bool, probe: str
) -> None:
    # Turns keep generic plans: one made while the receipts' statistics are young stays until
    # an ANALYZE. An expiry index that led with actor_type matched the probe's equality too, was
    # rated one row like the key, and was taken after an ANALYZE of one receipt: every turn
    # then read every receipt of the type (migration 0010). The probe is the lock statement's
    # function (migration 0011), and on Citus admission_read, here planned on plain PostgreSQL.
    async with akter_test(ALL, relay=False) as t:
        if t.on_citus:
            pytest.skip("the probe's plan on Citus is a worker's, per shard")
        counter = t.get(Counter, "probe")
        await counter.add(1)
        if analyzed:
            await t.rows("ANALYZE {schema}.receipts")
        await t.rows(_FILL_RECEIPTS, {"n": 2_000, "id": "probe"})
        (key,) = await t.rows(
            "SELECT routing_key, tenant_id, actor_type FROM {schema}.actors"
            " WHERE actor_id = 'probe'"
        )
        args = {
            "off": "0",
            "rk": str(key["routing_key"]),
            "tenant": f"'{key['tenant_id']}'",
            "type": f"'{key['actor_type']}'",
            "id": "'probe'",
            "command_ids": "ARRAY['fill-7']::text[]",
        }
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            if probe == "admission_read":
                plan = await _statement_plan(conn, t.runtime._store.queries[probe], args)
            else:
                call = "SELECT {}.admission_receipts({rk}, {tenant}, {type}, {id}, {command_ids})"
                plan = await _nested_plan(conn, call.format(f'"{t.schema}"', **args), "receipts")
        assert list(_scans(plan)) == [("Index Scan", "receipts_pkey")]
        assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 20


async def _statement_plan(
    conn: psycopg.AsyncConnection[Any], statement: str, args: dict[str, str]
) -> dict[str, Any]:
    """A catalogue statement's plan, prepared with its parameters and run once."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    await conn.execute(f"PREPARE probe AS {numbered}".encode())
    cur = await conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe ({})".format(
            ", ".join(args[n] for n in names)
        ).encode()
    )
    row = await cur.fetchone()
    assert row is not None
    return cast(dict[str, Any], row[0][0]["Plan"])


async def _nested_plan(conn: psycopg.AsyncConnection[Any], call: str, reads: str) -> dict[str, Any]:
    """The plan of the query inside a function that ``call`` runs and that reads ``reads``.

    ``auto_explain`` logs every statement's plan, nested ones included, as a notice.
    """
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    await conn.execute("LOAD 'auto_explain'")
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_analyze = on",
        "auto_explain.log_buffers = on",
        "auto_explain.log_format = json",
        "auto_explain.log_level = notice",
    ):
        await conn.execute(f"SET {setting}".encode())
    await conn.execute(call.encode())
    plans = [json.loads(n.partition("plan:")[2]) for n in notices if "plan:" in n]
    nested = [
        p
        for p in plans
        if f".{reads} " in p["Query Text"] and "admission_receipts" not in p["Query Text"]
    ]
    assert len(nested) == 1, notices
    return cast(dict[str, Any], nested[0]["Plan"])


async def test_the_admission_ships_receipts_only_when_one_is_stored(akter_test: Make) -> None:
    # A new command's admission answers NULL, not '[]': the client then has no JSON to decode
    # on the usual turn. A stored receipt still comes back whole, and the call replays from it.
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "shipped")
        first, second = await t.runtime.mint_command_id(), await t.runtime.mint_command_id()
        assert await counter.with_command_id(first).add(2) == 2
        (key,) = await t.rows(
            "SELECT routing_key, tenant_id, actor_type FROM {schema}.actors"
            " WHERE actor_id = 'shipped'"
        )
        params = {
            "off": 0,
            "rk": key["routing_key"],
            "tenant": key["tenant_id"],
            "type": key["actor_type"],
            "id": "shipped",
        }
        statement = t.runtime._store.queries["admission_read"]
        (fresh,) = await t.rows(statement, {**params, "command_ids": [second]})
        assert fresh["receipts"] is None
        (stored,) = await t.rows(statement, {**params, "command_ids": [second, first]})
        (receipt,) = await t.rows("SELECT command_id, outcome FROM {schema}.receipts")
        assert [(r["command_id"], r["outcome"]) for r in stored["receipts"]] == [
            (receipt["command_id"], receipt["outcome"])
        ]
        assert await counter.with_command_id(first).add(2) == 2
        (row,) = await t.rows("SELECT state FROM {schema}.actors WHERE actor_id = 'shipped'")
        assert row["state"]["n"] == 2 and row["state"]["applied"] == [first]


async def test_only_an_id_minted_for_its_call_skips_the_receipt_probe(akter_test: Make) -> None:
    # An id minted for the call has no receipt before its first attempt commits: that attempt
    # does not probe. A pinned id is probed. The probe is made to fail, so each call shows
    # whether its turn called it.
    async with akter_test(ALL, relay=False) as t:
        if t.on_citus:
            pytest.skip("Citus turns probe with admission_read, not admission_receipts")
        counter = t.get(Counter, "unseen")
        assert await counter.add(1) == 1
        await t.rows(
            "CREATE OR REPLACE FUNCTION {schema}.admission_receipts(p_rk bigint, p_tenant text,"
            " p_type text, p_id text, p_command_ids text[]) RETURNS jsonb LANGUAGE plpgsql"
            " VOLATILE AS $$ BEGIN RAISE EXCEPTION 'probed %%', p_command_ids; END $$"
        )
        assert await counter.add(2) == 3
        cid = await t.runtime.mint_command_id()
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(Counter, "unseen", "add", {"k": 4}, command_id=cid, retry=False)
        # P0001: the probe's RAISE
        assert raised.value.reason == "ActorUnavailable" and "P0001" in raised.value.message
        (row,) = await t.rows("SELECT state FROM {schema}.actors WHERE actor_id = 'unseen'")
        assert row["state"]["n"] == 3 and cid not in row["state"]["applied"]


async def test_a_minted_id_whose_commit_answer_was_lost_is_probed_on_retry(
    akter_test: Make,
) -> None:
    # The first attempt of a minted id commits, and its answer is lost: the retry, with the same
    # id, must find the receipt and replay (not run the handler again).
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "lost")
        assert await counter.add(1) == 1
        t.crash_next("after_commit")
        assert await counter.add(7) == 8
        assert t.runtime.hooks.fired == [("after_commit", "crash")]
        (row,) = await t.rows("SELECT state, version FROM {schema}.actors WHERE actor_id = 'lost'")
        assert row["state"]["n"] == 8 and len(row["state"]["applied"]) == 2
        assert row["version"] == 2
        receipts = await t.rows("SELECT command_id FROM {schema}.receipts")
        assert sorted(r["command_id"] for r in receipts) == sorted(row["state"]["applied"])


async def test_a_lone_receipt_and_a_batch_of_receipts_are_written_alike(akter_test: Make) -> None:
    # A one-command turn writes its receipt with scalar parameters (update_actor_receipt), a
    # batch with arrays (update_actor_receipts): the rows must not tell them apart.
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "alike")
        ids = [await t.runtime.mint_command_id() for _ in range(3)]
        held = t.pause_next("before_commit")
        lone = asyncio.create_task(counter.with_command_id(ids[0]).add(1))
        await held.wait()
        batched = [
            asyncio.create_task(counter.with_command_id(cid).add(k))
            for cid, k in zip(ids[1:], (2, 3), strict=True)
        ]
        await until_pending(t.runtime, 3)
        held.release()
        assert [await lone, *[await b for b in batched]] == [1, 3, 6]
        rows = await t.rows(
            "SELECT command_id, command, payload_hash, caller_key, outcome, expires_at_ms"
            " FROM {schema}.receipts WHERE actor_id = 'alike'"
        )
        by_id = {r["command_id"]: r for r in rows}
        for cid, k, n in zip(ids, (1, 2, 3), (1, 3, 6), strict=True):
            row = by_id[cid]
            assert row["command"] == "add" and row["outcome"] == {"ok": n}
            assert row["payload_hash"] == payload_hash({"k": k})
            assert row["caller_key"] == by_id[ids[0]]["caller_key"]
            expiry = parse_command_id(cid, t.runtime.config.window_ms).expires_ms
            assert row["expires_at_ms"] == expiry
        (actor,) = await t.rows("SELECT version FROM {schema}.actors WHERE actor_id = 'alike'")
        assert actor["version"] == 2  # two turns: the lone command, then the batch of two
