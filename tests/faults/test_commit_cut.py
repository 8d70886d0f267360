"""The database connection cut around ``COMMIT`` (conformance TU-13).

The runtime reaches PostgreSQL through :class:`~tests.faults.pg_proxy.PgProxy`, which cuts the
turn's connection at its commit flight: before the ``COMMIT`` reaches the server (rolled back),
after the server answered it but before the answer reaches the runtime (committed, unknown to
the caller), or right as it is sent (either). Whatever happened, the caller must see a retryable
error — never a success nor a declared failure — and the retry with the same id must resolve it:
by running the command now, or by replaying its receipt. The durable rows show one application;
the pool replaces the dead connection and the runtime goes on.

Inspection and clean-up connect to PostgreSQL directly, never through the proxy.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import BaseModel, Field

import akter
from akter.testing import ActorTest
from akter.testing.harness import Inspection
from tests.faults.actors import Sink
from tests.faults.pg_proxy import Cut, PgProxy

pytestmark = pytest.mark.timeout(60)

CUTS: list[Cut] = ["before", "after_reply", "race"]
#: Longest wait for a cut connection's backend to end (it only has to notice the end of input).
SETTLE_WITHIN = 10.0
#: Turns enough for some pool connection to run COMMIT as a prepared statement: psycopg
#: prepares a statement on its third execution on a connection (``prepare_threshold=2``).
WARM_TURNS = 10

#: Handler runs per actor id, in memory: a replay does not run the handler, a re-run does.
RUNS: collections.Counter[str] = collections.Counter()


class Till(BaseModel):
    """A total and, in order, the command ids that changed it (a durable run count)."""

    total: int = 0
    applied: list[str] = Field(default_factory=list)


class Moved(akter.Event, tag="tu13.Moved"):
    """Emitted by every applied ``Register.move``."""

    k: int
    total: int


class Short(akter.DeclaredError, tag="tu13.Short"):
    """The total cannot go below zero."""

    total: int
    asked: int


class Register(akter.Actor[Till]):
    """Moves a total; every application stages state, an event and an intent."""

    @akter.command(errors=[Short])
    async def move(self, k: int) -> int:
        """Add ``k`` (or fail with ``Short``), record the id, emit, notify the sink."""
        RUNS[self.id] += 1
        if self.state.total + k < 0:
            raise Short(total=self.state.total, asked=-k)
        self.state.total += k
        self.state.applied.append(self.command_id)
        self.emit(Moved(k=k, total=self.state.total))
        self.send(Sink.note, "x", k)
        return self.state.total

    @akter.query
    async def total(self) -> int:
        """The committed total."""
        return self.state.total


@asynccontextmanager
async def proxied(akter_db: str) -> AsyncIterator[tuple[ActorTest, PgProxy]]:
    """A harness whose runtime reaches PostgreSQL through a fresh proxy."""
    async with PgProxy(akter_db) as proxy, ActorTest([Register], database_url=proxy.url) as t:
        t.database_url = akter_db  # from here on: inspection and the schema's drop go direct
        yield t, proxy


def turns(t: ActorTest, outcome: str) -> float:
    """How many turns of ``Register`` ended with ``outcome`` (``retry``, ``replay`` ...)."""
    return t.runtime._engine.metrics.value("akter.turns", actor_type="Register", outcome=outcome)


def assert_applied_once(rows: Inspection, results: dict[str, int]) -> None:
    """Each command id applied exactly once, with one receipt, one event and one intent."""
    assert rows.state is not None
    applied = [str(cid) for cid in rows.state["applied"]]
    assert sorted(applied) == sorted(results)
    assert rows.version == len(results)
    assert {r["command_id"]: r["outcome"] for r in rows.receipts} == {
        cid: {"ok": total} for cid, total in results.items()
    }
    assert [e["command_id"] for e in rows.events] == applied
    assert [e["seq"] for e in rows.events] == list(range(1, len(applied) + 1))
    assert [e["payload"]["total"] for e in rows.events] == [results[cid] for cid in applied]
    assert len(rows.outbox) == len(applied)
    assert rows.state["total"] == (results[applied[-1]] if applied else 0)


async def cut_call(t: ActorTest, proxy: PgProxy, actor: str, k: int, cid: str) -> akter.ActorError:
    """Call ``move`` once, without the handle's retries, and return the error it must raise."""
    with pytest.raises(akter.ActorError) as raised:
        await t.runtime.call(Register, actor, "move", {"k": k}, command_id=cid, retry=False)
    assert proxy.fired.is_set(), "the armed cut never met its COMMIT"
    await settled(proxy)
    return raised.value


async def settled(proxy: PgProxy) -> None:
    """Wait until the cut connection's backend has ended: its transaction is decided."""
    try:
        await asyncio.wait_for(proxy.settled.wait(), SETTLE_WITHIN)
    except TimeoutError:
        pytest.fail(f"the cut backend did not end within {SETTLE_WITHIN} s")


def assert_retryable(error: akter.ActorError, cid: str) -> None:
    """A cut commit is a retryable ``ActorUnavailable`` for that id, never an outcome."""
    assert error.reason == "ActorUnavailable", error
    assert error.retryable is True
    # Cut in its commit flight, the turn's outcome is unknown to the runner (hardening 9).
    assert error.code == "outcome_unknown", error
    assert "may or may not have committed" in error.message
    assert error.command_id == cid
    assert error.retry_after is not None


async def assert_healthy(t: ActorTest, proxy: PgProxy, actor: str) -> None:
    """The pool dropped the cut connection and the runtime serves commands again."""
    pool = t.runtime._store.pool
    await pool.check()  # would discard (and count) a connection left unusable in the pool
    stats = pool.get_stats()
    assert stats.get("returns_bad", 0) + stats.get("connections_lost", 0) == 1, stats
    assert not proxy.armed
    # More concurrent commands than the pool keeps open, on fresh actors, then the cut one.
    handles = [t.get(Register, f"{actor}-after-{n}") for n in range(pool.min_size + 2)]
    totals = await asyncio.gather(*(h.move(n + 1) for n, h in enumerate(handles)))
    assert totals == [n + 1 for n in range(len(handles))]
    handle = t.get(Register, actor)
    before = await handle.total()
    assert await handle.move(100) == before + 100
    assert pool.get_stats().get("connections_lost", 0) == stats.get("connections_lost", 0)


# --- a pinned command id ------------------------------------------------------------------------


@pytest.mark.parametrize("existing", [False, True], ids=["new-actor", "existing-actor"])
@pytest.mark.parametrize("cut", CUTS)
async def test_a_cut_commit_is_retryable_and_the_retry_with_its_id_resolves_once(
    akter_db: str, cut: Cut, existing: bool
) -> None:
    actor = f"pinned-{cut}-{'old' if existing else 'new'}"
    RUNS.pop(actor, None)
    async with proxied(akter_db) as (t, proxy):
        handle = t.get(Register, actor)
        results: dict[str, int] = {}
        if existing:
            first = await t.runtime.mint_command_id()
            results[first] = await handle.with_command_id(first).move(1)
        before = await t.inspect(handle)
        cid = await t.runtime.mint_command_id()

        proxy.arm(cut, match=cid)
        assert_retryable(await cut_call(t, proxy, actor, 5, cid), cid)
        assert RUNS[actor] == len(results) + 1
        assert turns(t, "retry") == 1 and turns(t, "success") == len(results)

        landed = await t.inspect(handle)
        committed = cid in {r["command_id"] for r in landed.receipts}
        if cut == "before":
            assert not committed  # the server never saw the COMMIT
        if cut == "after_reply":
            assert committed  # the server answered COMMIT; the answer was lost
            assert proxy.swallowed is not None and proxy.swallowed[5:] == b"COMMIT\0"
        if committed:
            assert_applied_once(landed, {**results, cid: len(results) + 5})
        else:
            assert landed == before
            assert landed.exists is existing

        # The retry with the same id: a replay of the receipt, or the first commit of the turn.
        results[cid] = await handle.with_command_id(cid).move(5)
        assert results[cid] == len(results) + 4  # 5, or 1 + 5
        assert RUNS[actor] == len(results) + (0 if committed else 1)
        assert turns(t, "replay" if committed else "success") >= 1
        rows = await t.inspect(handle)
        assert_applied_once(rows, results)
        if committed:
            assert rows == landed  # the replay wrote nothing

        # And again: a replay, whatever happened before.
        assert await handle.with_command_id(cid).move(5) == results[cid]
        assert await t.inspect(handle) == rows
        await assert_healthy(t, proxy, actor)


@pytest.mark.parametrize("cut", ["before", "after_reply"])
async def test_a_cut_commit_of_a_declared_failure_is_retryable_then_resolves(
    akter_db: str, cut: Cut
) -> None:
    actor = f"short-{cut}"
    RUNS.pop(actor, None)
    async with proxied(akter_db) as (t, proxy):
        handle = t.get(Register, actor)
        assert await handle.move(2) == 2
        cid = await t.runtime.mint_command_id()

        proxy.arm(cut, match=cid)
        assert_retryable(await cut_call(t, proxy, actor, -10, cid), cid)
        assert RUNS[actor] == 2

        with pytest.raises(Short) as short:
            await handle.with_command_id(cid).move(-10)
        assert (short.value.total, short.value.asked) == (2, 10)
        assert RUNS[actor] == (2 if cut == "after_reply" else 3)
        rows = await t.inspect(handle)
        failures = [r for r in rows.receipts if r["command_id"] == cid]
        assert [r["outcome"]["error"] for r in failures] == ["tu13.Short"]
        succeeded = [r["command_id"] for r in rows.receipts if "ok" in r["outcome"]]
        assert rows.state == {"total": 2, "applied": succeeded}
        assert rows.version == 1 and len(rows.events) == 1 and len(rows.outbox) == 1
        await assert_healthy(t, proxy, actor)


# --- the handle's own retry ---------------------------------------------------------------------


@pytest.mark.parametrize("cut", CUTS)
async def test_the_handle_retries_a_cut_commit_and_the_caller_sees_one_success(
    akter_db: str, cut: Cut
) -> None:
    actor = f"auto-{cut}"
    RUNS.pop(actor, None)
    async with proxied(akter_db) as (t, proxy):
        handle = t.get(Register, actor)
        assert await handle.move(1) == 1

        proxy.arm(cut, match=actor)  # the command id is minted inside the call
        assert await handle.move(5) == 6
        assert proxy.fired.is_set(), "the armed cut never met its COMMIT"
        await settled(proxy)
        assert turns(t, "retry") == 1  # the caller never saw the cut turn's error

        rows = await t.inspect(handle)
        assert rows.state is not None
        cid = str(rows.state["applied"][-1])
        assert_applied_once(rows, {str(rows.state["applied"][0]): 1, cid: 6})
        replayed = turns(t, "replay") == 1
        if cut == "before":
            assert not replayed
        if cut == "after_reply":
            assert replayed
        assert RUNS[actor] == (2 if replayed else 3)
        await assert_healthy(t, proxy, actor)


async def test_an_unarmed_proxy_relays_every_commit_untouched(akter_db: str) -> None:
    async with proxied(akter_db) as (t, proxy):
        handle = t.get(Register, "plain")
        results: dict[str, Any] = {}
        for k in range(1, WARM_TURNS + 1):
            cid = await t.runtime.mint_command_id()
            results[cid] = await handle.with_command_id(cid).move(k)
        assert list(results.values()) == [k * (k + 1) // 2 for k in range(1, WARM_TURNS + 1)]
        assert_applied_once(await t.inspect(handle), results)
        assert not proxy.fired.is_set()
        # The turns commit through the extended protocol, with the COMMIT their connection
        # prepared in its first turn's commit flight (akter._store.pipeline).
        binds = [c for c in proxy.commits if c.startswith("Bind")]
        assert len(binds) >= WARM_TURNS
        assert all(c.startswith("Bind 'akter_turn_") for c in binds), binds


@pytest.mark.parametrize("cut", ["before", "after_reply"])
async def test_a_cut_prepared_commit_is_retryable_and_resolves_once(
    akter_db: str, cut: Cut
) -> None:
    actor = f"prepared-{cut}"
    RUNS.pop(actor, None)
    async with proxied(akter_db) as (t, proxy):
        handle = t.get(Register, actor)
        results: dict[str, int] = {}
        total = 0
        # Only a COMMIT bound to a prepared statement takes the cut (a turn prepares COMMIT in
        # its connection's first commit flight; any turn before a cut commits normally).
        for _ in range(WARM_TURNS):
            cid = await t.runtime.mint_command_id()
            proxy.arm(cut, match=cid, prepared=True)
            try:
                total = await t.runtime.call(
                    Register, actor, "move", {"k": 1}, command_id=cid, retry=False
                )
            except akter.ActorError as error:
                assert proxy.fired.is_set()
                assert_retryable(error, cid)
                await settled(proxy)
                break
            assert not proxy.fired.is_set()
            results[cid] = total
        else:
            pytest.fail(f"no turn committed through a prepared COMMIT in {WARM_TURNS} turns")
        assert proxy.cut_commit is not None and proxy.cut_commit != "Bind ''"
        assert RUNS[actor] == len(results) + 1

        results[cid] = await handle.with_command_id(cid).move(1)
        assert results[cid] == total + 1
        assert RUNS[actor] == len(results) + (1 if cut == "before" else 0)
        assert_applied_once(await t.inspect(handle), results)
        await assert_healthy(t, proxy, actor)


@pytest.mark.parametrize("turn_mode", ["shared", "one_flight", "two_flights"], indirect=True)
async def test_a_warm_turn_is_one_or_two_syncs_of_prepared_statements_on_the_wire(
    akter_db: str, turn_mode: str
) -> None:
    # Issue 13's two-round-trip rule, counted on the wire: each warm turn of Register (state and
    # receipt in one statement, an event, an intent) sends BEGIN, the lock with its clock and
    # receipt probe, the update, the event, the outbox row and COMMIT, each bound to the
    # statement its connection prepared in its first turn, in two flights ended by one Sync each.
    # Issue 45's one flight: BEGIN, the guard (settings, lock and checks), the same writes and
    # COMMIT, six statements ended by one Sync (on plain PostgreSQL; Citus keeps two flights).
    async with (
        PgProxy(akter_db) as proxy,
        ActorTest([Register], database_url=proxy.url, relay=False) as t,
    ):
        t.database_url = akter_db
        handle = t.get(Register, "wire")
        for k in range(3):
            await handle.move(k)
        before = proxy.sent(b"akter_turn_")
        for k in range(WARM_TURNS):
            await handle.move(k)
        sent = proxy.sent(b"akter_turn_") - before
        # On Citus the admission also bounds the workers' lock wait (two statements), probes
        # the receipts apart from the lock and reads the coordinator's clock (one each): four
        # more, in the same two flights.
        statements = 10 if t.on_citus else 6
        flights = 1 if turn_mode != "two_flights" and not t.on_citus else 2
        assert sent["S"] == flights * WARM_TURNS, sent
        assert sent["E"] == sent["B"] == statements * WARM_TURNS, sent
        assert sent["P"] == 0 and sent["Q"] == 0, sent
