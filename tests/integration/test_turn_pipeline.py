"""The turn's flights on libpq's pipeline (``akter._store.pipeline``, issue 13).

What a careless handler, a refused write, a dropped prepared statement or a turn cut mid-flight
does to the connection a turn runs on: the caller gets a named, retryable refusal, nothing is
written, and the next turn runs (on a pool of one connection, so it must be a usable one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psycopg
import pytest
from pydantic import BaseModel

import akter
from akter._store.pipeline import TurnPipeline
from akter.testing import ActorTest
from tests._support.citus import ON_CITUS, trigger_refused
from tests._support.policy import policy_override
from tests._support.polling import until

#: Every test runs with warm turns in one flight and in two (rule 7 of one-flight-turn.md).
pytestmark = pytest.mark.usefixtures("turn_mode")

Make = Callable[..., ActorTest]

#: The refused write and the slow write are a trigger's on the actors table.
NO_TRIGGER = pytest.mark.skipif(ON_CITUS, reason=trigger_refused("the failing write", "actors"))


class NoteState(BaseModel):
    notes: list[str] = []
    poison: bool = False


class Notes(akter.Actor[NoteState], max_state_bytes=8_000_000):
    @akter.command
    async def keep(self, text: str) -> str:
        self.state.notes.append(text)
        return text

    @akter.command
    async def bulk(self, size: int, count: int) -> int:
        self.state.notes = [chr(ord("a") + i % 26) * size for i in range(count)]
        return sum(len(n) for n in self.state.notes)

    @akter.command
    async def poisoned(self) -> None:
        self.state.poison = True

    @akter.query
    async def total(self) -> int:
        return sum(len(n) for n in self.state.notes)


async def _install_trigger(t: ActorTest, body: str) -> None:
    await t.rows(
        "CREATE FUNCTION {schema}.test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        + body
        + " RETURN NEW; END $$"
    )
    await t.rows(
        "CREATE TRIGGER test_refuse BEFORE UPDATE ON {schema}.actors "
        "FOR EACH ROW EXECUTE FUNCTION {schema}.test_refuse()"
    )


async def _drop_trigger(t: ActorTest) -> None:
    await t.rows("DROP TRIGGER test_refuse ON {schema}.actors")
    await t.rows("DROP FUNCTION {schema}.test_refuse()")


async def _refused(
    t: ActorTest, actor_id: str, member: str, payload: dict[str, str]
) -> tuple[akter.ActorError, str]:
    """Call once without the handle's retries; the refusal it must raise, and its command id."""
    cid = await t.runtime.mint_command_id()
    with pytest.raises(akter.ActorError) as refused:
        await t.runtime.call(Notes, actor_id, member, payload, command_id=cid, retry=False)
    return refused.value, cid


async def test_a_state_larger_than_the_socket_buffers_commits_and_ships_back(
    akter_test: Make,
) -> None:
    # 6 MB of state in the commit flight, then shipped whole in a cold admission's answer: the
    # flight is flushed while the server's answers are read, so neither side waits forever.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "big")
        assert await notes.bulk(60_000, 100) == 6_000_000
        assert await notes.keep("after") == "after"
        t.runtime._dispatcher.drop_caches()
        assert await notes.keep("cold") == "cold"
        assert await notes.total() == 6_000_000 + len("after") + len("cold")
        row = await t.inspect(notes)
        assert row.version == 3 and len(row.state["notes"]) == 102  # type: ignore[index]


@pytest.mark.parametrize(
    "text",
    [
        "%(id)s",
        "%s %% %(rk)s",
        "$1 $2::text",
        "'; ROLLBACK; --",
        '{"json": "inside"}',
        "\\x00 not a NUL",
        "tab\tline\u2028sep\U0001f600",
        "é" * 3000,
    ],
)
async def test_parameter_text_that_looks_like_sql_or_placeholders_is_stored_as_sent(
    akter_test: Make, text: str
) -> None:
    # Only a statement's text is converted to $n placeholders; parameters go out as values.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "text")
        assert await notes.keep(text) == text
        t.runtime._dispatcher.drop_caches()
        assert await notes.keep(text) == text
        row = await t.inspect(notes)
        assert row.state is not None and row.state["notes"] == [text, text]
        assert [r["outcome"] for r in row.receipts] == [{"ok": text}, {"ok": text}]


@NO_TRIGGER
async def test_a_write_the_server_refuses_commits_nothing_and_the_next_turn_runs(
    akter_test: Make,
) -> None:
    # The update fails in the commit flight (a trigger raises); the statements behind it are
    # aborted. The server's error proves the rollback, so the refusal is not outcome_unknown.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "refused")
        await notes.keep("first")
        await _install_trigger(
            t, "IF NEW.state->>'poison' = 'true' THEN RAISE EXCEPTION 'refused by test'; END IF;"
        )
        before = await t.inspect(notes)
        refused, _ = await _refused(t, "refused", "poisoned", {})
        assert refused.reason == "ActorUnavailable"
        assert refused.code != "outcome_unknown"
        assert "P0001" in refused.message
        after = await t.inspect(notes)
        assert (after.version, after.state, after.receipts) == (
            before.version,
            before.state,
            before.receipts,
        )
        # The same pool's one connection (replaced) runs the next turns, prepared afresh.
        assert await notes.keep("second") == "second"
        assert await notes.keep("third") == "third"
        assert (await t.inspect(notes)).state["notes"] == ["first", "second", "third"]  # type: ignore[index]


async def test_prepared_statements_dropped_under_a_connection_cost_one_retryable_turn(
    akter_test: Make,
) -> None:
    # Something ran DEALLOCATE ALL on the turn connection (a pool reset, a careless script):
    # the next turn is refused, retryable, with nothing written; a handle's retry never sees it.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "dropped")
        await notes.keep("one")
        async with t.runtime._store.pool.connection() as conn:
            await conn.execute("DEALLOCATE ALL")
        refused, _ = await _refused(t, "dropped", "keep", {"text": "x"})
        assert refused.reason == "ActorUnavailable"
        assert "26000" in refused.message
        assert (await t.inspect(notes)).version == 1
        async with t.runtime._store.pool.connection() as conn:
            await conn.execute("DEALLOCATE ALL")
        assert await notes.keep("two") == "two"  # the handle retries the refusal
        row = await t.inspect(notes)
        assert row.version == 2 and row.state["notes"] == ["one", "two"]  # type: ignore[index]


@NO_TRIGGER
async def test_a_turn_cut_short_mid_flight_by_its_deadline_leaves_no_transaction_behind(
    akter_test: Make, akter_db: str
) -> None:
    # The update sleeps past the turn's execution timeout: the client's deadline or the
    # server's statement timeout ends the commit flight with answers still owed. The connection
    # is discarded (no transaction of the schema's role left open), nothing is written.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "cut")
        await notes.keep("kept")
        await _install_trigger(t, "PERFORM pg_sleep(2);")
        with policy_override(Notes, akter.Policy(execution_timeout=0.3)):
            cut, cid = await _refused(t, "cut", "keep", {"text": "x"})
        assert cut.reason in ("ActorUnavailable", "Timeout")
        await _drop_trigger(t)
        assert (await t.inspect(notes)).version == 1
        # The retry with the same id applies it once.
        assert await notes.with_command_id(cid).keep("x") == "x"
        row = await t.inspect(notes)
        assert row.version == 2 and row.state["notes"] == ["kept", "x"]  # type: ignore[index]

        async def open_transactions() -> int:
            rows = await t.rows(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%%'"
            )
            return int(rows[0]["n"])

        # The discarded session ends as the server notices its socket closed.
        await until(open_transactions, holds=lambda n: n == 0, what="no open transaction")


async def test_a_turn_connection_goes_back_to_the_pool_unwatched(akter_test: Make) -> None:
    # A turn watches its socket from its first wait until it leaves the pipeline. psycopg's own
    # statements on the same pooled connection register and remove their reader on that socket
    # too: were a turn's registration left behind, psycopg's removal would silence it and the
    # next turn would wait for an answer nobody reports.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "unwatched")
        for i in range(10):
            async with asyncio.timeout(10):
                assert await notes.keep(str(i)) == str(i)
                async with t.runtime._store.pool.connection() as conn:
                    await conn.execute("SELECT 1")
        row = await t.inspect(notes)
        assert row.version == 10


# Between flights: only a two-flight turn has that window (a warm one-flight turn holds nothing
# while its handler runs; its cut flights are tests/faults/test_one_flight_cut.py's).
@pytest.mark.parametrize("turn_mode", ["two_flights"], indirect=True)
async def test_the_server_ending_a_session_between_flights_costs_one_retry_and_no_spin(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The turn's backend is terminated while its handler's result waits for the commit flight:
    # the socket turns readable with nobody waiting on it. The watcher reads the end of the
    # session once and stops watching (a readable socket left watched would call it on every
    # loop iteration); the commit flight then fails, the handle's retry commits once.
    calls = 0
    on_readable = TurnPipeline._on_readable

    def counted(self: TurnPipeline) -> None:
        nonlocal calls
        calls += 1
        on_readable(self)

    monkeypatch.setattr(TurnPipeline, "_on_readable", counted)
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "ended")
        await notes.keep("one")
        held = t.pause_next("before_commit")
        call = asyncio.ensure_future(notes.keep("two"))
        try:
            await held.wait()
            pids = await t.rows(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%%'"
                # This test's sessions only: others may share the database.
                " AND query LIKE '%%{schema}.%%'"
            )
            assert len(pids) == 1
            await t.rows("SELECT pg_terminate_backend(%(pid)s::int)", {"pid": pids[0]["pid"]})

            async def gone() -> int:
                rows = await t.rows(
                    "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %(pid)s",
                    {"pid": pids[0]["pid"]},
                )
                return int(rows[0]["n"])

            await until(gone, holds=lambda n: n == 0, what="the backend gone")
            before = calls
            await asyncio.sleep(0.1)  # loop iterations with the ended session's socket readable
            assert calls - before <= 2
        finally:
            held.release()
        assert await call == "two"
        row = await t.inspect(notes)
        assert row.version == 2 and row.state["notes"] == ["one", "two"]  # type: ignore[index]


@NO_TRIGGER
async def test_a_session_ended_while_a_flight_waits_wakes_the_turn_at_once(
    akter_test: Make,
) -> None:
    # The commit flight's update sleeps in a trigger when its backend is terminated: the turn's
    # wait must end with the session, not at the turn's deadline (a minute here). The commit was
    # sent and not answered, so the caller is told the outcome is unknown; the retry with the
    # same id applies the command once.
    async with akter_test([Notes], pool_size=1) as t:
        notes = t.get(Notes, "ended-mid-flight")
        await notes.keep("one")
        await _install_trigger(t, "PERFORM pg_sleep(30);")
        with policy_override(Notes, akter.Policy(execution_timeout=60)):
            cid = await t.runtime.mint_command_id()
            call = asyncio.ensure_future(
                t.runtime.call(
                    Notes, "ended-mid-flight", "keep", {"text": "two"}, command_id=cid, retry=False
                )
            )

            async def sleeping() -> list[dict[str, object]]:
                return await t.rows(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event = 'PgSleep'"
                )

            pids = await until(sleeping, holds=lambda rows: len(rows) == 1, what="the update")
            await t.rows("SELECT pg_terminate_backend(%(pid)s::int)", {"pid": pids[0]["pid"]})
            async with asyncio.timeout(10):
                with pytest.raises(akter.ActorError) as refused:
                    await call
        assert refused.value.retryable
        await _drop_trigger(t)
        assert (await t.inspect(notes)).version == 1
        assert await notes.with_command_id(cid).keep("two") == "two"
        row = await t.inspect(notes)
        assert row.version == 2 and row.state["notes"] == ["one", "two"]  # type: ignore[index]


async def test_work_given_to_a_sync_runs_while_the_server_works_on_the_flight(
    akter_db: str,
) -> None:
    # ``sync(meanwhile)`` runs its work once the whole flight is sent and before any answer is
    # read: the flight's statement waits on a lock held here, and the work itself sees it
    # waiting, then releases it. The answers arrive after, complete.
    seen: list[object] = []
    with psycopg.connect(akter_db, autocommit=True) as blocker:
        blocker.execute("SELECT pg_advisory_lock(7013)")
        conn = await psycopg.AsyncConnection.connect(akter_db, autocommit=True)
        try:
            pipe = TurnPipeline(conn)
            pid = conn.info.backend_pid
            pipe.enter()
            await pipe.execute("BEGIN")
            answer = await pipe.execute("SELECT pg_advisory_xact_lock(7013), %(k)s::int", {"k": 5})
            await pipe.execute("COMMIT")

            def meanwhile() -> None:
                with pytest.raises(psycopg.InterfaceError):
                    answer.statusmessage  # noqa: B018 - not answered yet
                for _ in range(500):
                    row = blocker.execute(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
                    ).fetchone()
                    if row is not None and row[0] == "Lock":
                        break
                    time.sleep(0.01)
                seen.append(row)
                blocker.execute("SELECT pg_advisory_unlock(7013)")

            async with asyncio.timeout(30):  # work run after the answers would wait forever
                await pipe.sync(meanwhile)
            assert seen == [("Lock",)]
            assert await answer.fetchone() == ("", 5)
            assert pipe.leave()
        finally:
            await conn.close()
