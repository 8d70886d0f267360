"""``akter.SyncRuntime``: the async runtime driven from synchronous code, on a real PostgreSQL.

Each test starts its own SyncRuntime on a fresh schema, dropped at the end. Ordering comes from
``threading`` barriers and events, never from sleeps.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

import akter
from akter.sync import SyncRuntimeError

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


class Funds(BaseModel):
    cents: int = 0


class Deposited(akter.Event, tag="sync.deposited"):
    cents: int


class Overdrawn(akter.DeclaredError, tag="sync_runtime.Overdrawn"):
    short: int


class Topup(BaseModel):
    cents: int


#: Set by a test to hold the ``hold`` command inside its turn: (entered, release).
HOLD: dict[str, threading.Event] = {}


class Account(akter.Actor[Funds], access=akter.public, events=[Deposited], delivery_timeout=5):
    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        self.emit(Deposited(cents=cents))
        return self.state.cents

    @akter.command(errors=[Overdrawn])
    async def withdraw(self, cents: int) -> int:
        if cents > self.state.cents:
            raise Overdrawn(short=cents - self.state.cents)
        self.state.cents -= cents
        return self.state.cents

    @akter.command
    async def explode(self) -> None:
        raise RuntimeError("a careless handler")

    @akter.command
    async def whoami(self) -> str:
        return repr(self.caller)

    @akter.command
    async def hold(self) -> int:
        HOLD["entered"].set()
        # A threading.Event the test thread sets; polled, since waiting for it in a worker
        # thread would hold up the loop's shutdown when the drain cancels this turn.
        while not HOLD["release"].is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        self.state.cents += 1
        return self.state.cents

    @akter.command(internal=True)
    async def audit(self) -> None:
        self.state.cents = -1

    @akter.query
    async def balance(self) -> int:
        return self.state.cents

    @akter.workflow
    async def double(wf: akter.Workflow, cents: int) -> int:
        first = await wf.get(Account, wf.ref.id).deposit(cents)
        return await wf.get(Account, wf.ref.id).deposit(first)

    @akter.workflow
    async def wait_topup(wf: akter.Workflow) -> int:
        got = await wf.wait(Topup)
        assert got is not None
        return got.cents


class Slow(akter.Actor[Funds], access=akter.public, execution_timeout=0.3, delivery_timeout=1):
    @akter.command
    async def crawl(self) -> None:
        await asyncio.sleep(5)


async def stray(account: Account) -> int:
    return 0


@pytest.fixture
def schema(akter_db: str) -> Iterator[str]:
    name = f"sync_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def rt(akter_db: str, schema: str) -> Iterator[akter.SyncRuntime]:
    with akter.SyncRuntime(actors=[Account, Slow], database_url=akter_db, schema=schema) as rt:
        yield rt


def committed_cents(akter_db: str, schema: str, id: str) -> int | None:
    with psycopg.connect(akter_db) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT state->>'cents' FROM {}.actors"
                " WHERE actor_type = 'Account' AND actor_id = %s"
            ).format(sql.Identifier(schema)),
            (id,),
        ).fetchone()
    return None if row is None else int(row[0])


def test_commands_queries_and_events_block_and_return_typed_values(
    rt: akter.SyncRuntime, akter_db: str, schema: str
) -> None:
    account = rt.get(Account, "a-1")
    assert account.call(Account.deposit, cents=500) == 500
    assert rt.call(Account.deposit, "a-1", 250) == 750
    assert account.call(Account.balance) == 750
    records = account.events()
    assert [r.event for r in records] == [Deposited(cents=500), Deposited(cents=250)]
    assert [r.event for r in account.events(after=records[0].cursor)] == [Deposited(cents=250)]
    assert committed_cents(akter_db, schema, "a-1") == 750
    # The bridge runs anything the async API offers, typed as the coroutine's result.
    assert rt.run(rt.runtime.get(Account, "a-1").balance()) == 750


def test_a_pinned_command_id_replays_instead_of_applying_twice(
    rt: akter.SyncRuntime, akter_db: str, schema: str
) -> None:
    cid = rt.mint_command_id()
    account = rt.get(Account, "a-2").with_command_id(cid)
    assert account.call(Account.deposit, cents=10) == 10
    assert account.call(Account.deposit, cents=10) == 10  # the receipt's replay
    assert committed_cents(akter_db, schema, "a-2") == 10
    with pytest.raises(akter.ActorError) as conflict:
        account.call(Account.deposit, cents=11)
    assert conflict.value.reason == "CommandConflict"


def test_errors_are_the_async_apis_own(rt: akter.SyncRuntime, akter_db: str, schema: str) -> None:
    account = rt.get(Account, "a-3")
    account.call(Account.deposit, cents=5)
    with pytest.raises(Overdrawn) as overdrawn:
        account.call(Account.withdraw, cents=9)
    assert overdrawn.value.short == 4
    with pytest.raises(akter.ActorError) as invalid:
        account.call(Account.deposit, cents="many")  # type: ignore[arg-type]
    assert (invalid.value.reason, invalid.value.field) == ("InvalidInput", "cents")
    with pytest.raises(akter.ActorError) as defect:
        account.call(Account.explode)
    assert defect.value.reason == "Defect"
    with pytest.raises(akter.ActorError) as other:  # a member of another type
        account.call(Slow.crawl)  # type: ignore[arg-type]
    assert (other.value.reason, other.value.code) == ("InvalidInput", "unknown_member")
    with pytest.raises(akter.ActorError) as internal:  # as refused to an async handle
        account.call(Account.audit)
    assert (internal.value.reason, internal.value.code) == ("InvalidInput", "unknown_member")
    with pytest.raises(akter.ActorError) as not_a_member:
        rt.call(stray, "a-3")  # well typed, but no member of an actor
    assert not_a_member.value.reason == "InvalidInput"
    with pytest.raises(akter.ActorError) as bad_id:
        rt.get(Account, "")
    assert bad_id.value.reason == "InvalidInput"
    assert committed_cents(akter_db, schema, "a-3") == 5  # every refusal left the row as it was


def test_timeouts_are_the_async_apis_and_the_bridges_own(rt: akter.SyncRuntime) -> None:
    with pytest.raises(akter.ActorError) as turn:
        rt.get(Slow, "s-1").call(Slow.crawl)
    assert turn.value.reason == "Timeout"
    HOLD.update(entered=threading.Event(), release=threading.Event())
    try:
        with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
            rt.run(rt.runtime.get(Account, "a-4").hold(), timeout=0.2)
    finally:
        HOLD["release"].set()
    assert rt.get(Account, "a-5").call(Account.deposit, cents=1) == 1  # still serving


def test_workflows_start_signal_and_return_their_result(rt: akter.SyncRuntime) -> None:
    run = rt.get(Account, "a-6").start(Account.double, cents=3)
    assert run.result(timeout=30) == 6
    assert rt.workflow_run(run.id).status().status == "completed"
    waiting = rt.get(Account, "a-7").start(Account.wait_topup)
    waiting.signal(Topup(cents=42))
    assert waiting.result(timeout=30) == 42
    stuck = rt.get(Account, "a-8").start(Account.wait_topup)
    with pytest.raises(TimeoutError):
        stuck.result(timeout=0.05)
    stuck.cancel()
    with pytest.raises(akter.WorkflowCancelled):
        stuck.result(timeout=30)


def test_the_calling_threads_caller_scope_carries_over(rt: akter.SyncRuntime) -> None:
    account = rt.get(Account, "a-9")
    with akter.as_caller(akter.User("alice")):
        assert "alice" in account.call(Account.whoami)
    assert "process" in account.call(Account.whoami)


def test_sixteen_threads_share_one_runtime_and_every_deposit_counts(
    rt: akter.SyncRuntime, akter_db: str, schema: str
) -> None:
    threads, calls = 16, 25
    start = threading.Barrier(threads)
    failures: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            start.wait()
            for _ in range(calls):
                rt.get(Account, f"shared-{n % 4}").call(Account.deposit, cents=1)
                rt.call(Account.deposit, "total", 1)
        except BaseException as exc:
            failures.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert failures == []
    assert committed_cents(akter_db, schema, "total") == threads * calls
    assert [committed_cents(akter_db, schema, f"shared-{k}") for k in range(4)] == [100] * 4
    assert rt.get(Account, "total").call(Account.balance) == threads * calls


def test_a_call_from_a_thread_running_an_event_loop_is_refused(rt: akter.SyncRuntime) -> None:
    async def inside() -> None:
        rt.get(Account, "a-10").call(Account.deposit, cents=1)

    with pytest.raises(SyncRuntimeError) as refused:
        asyncio.run(inside())
    assert refused.value.reason == "event_loop"

    async def on_its_own_loop() -> None:  # the SyncRuntime's own loop thread: a deadlock avoided
        rt.get(Account, "a-10").call(Account.deposit, cents=1)

    with pytest.raises(SyncRuntimeError) as own:
        rt.run(on_its_own_loop())
    assert own.value.reason == "event_loop"
    assert rt.get(Account, "a-10").call(Account.balance) == 0


def test_a_wrapped_runtime_is_driven_and_stopped_by_its_sync_runtime(
    akter_db: str, schema: str
) -> None:
    runtime = akter.Runtime(actors=[Account], database_url=akter_db, schema=schema)
    with akter.SyncRuntime.wrap(runtime) as rt:
        assert rt.runtime is runtime and runtime.running
        assert rt.get(Account, "w").call(Account.deposit, cents=3) == 3
    assert not runtime.running and runtime.readiness == "drained"


async def test_wrapping_a_started_runtime_is_refused(akter_db: str, schema: str) -> None:
    async with akter.Runtime(actors=[Account], database_url=akter_db, schema=schema) as runtime:
        with pytest.raises(akter.ConfigurationError, match="not started"):
            akter.SyncRuntime.wrap(runtime)


def test_not_started_and_stopped_runtimes_refuse_by_name(akter_db: str, schema: str) -> None:
    rt = akter.SyncRuntime(actors=[Account], database_url=akter_db, schema=schema)
    with pytest.raises(SyncRuntimeError) as early:
        rt.get(Account, "a-11").call(Account.deposit, cents=1)
    assert early.value.reason == "not_started"
    assert isinstance(early.value, akter.ConfigurationError)
    rt.start()
    assert rt.running
    rt.get(Account, "a-11").call(Account.deposit, cents=1)
    report = rt.stop()
    assert report.status == "clean"
    assert rt.stop() is report  # idempotent
    assert not rt.running
    with pytest.raises(SyncRuntimeError) as late:
        rt.get(Account, "a-11").call(Account.deposit, cents=1)
    assert late.value.reason == "stopped"
    with pytest.raises(SyncRuntimeError) as again:
        rt.start()
    assert again.value.reason == "stopped"
    assert committed_cents(akter_db, schema, "a-11") == 1


def test_a_call_waiting_when_the_runtime_stops_is_told_so(akter_db: str, schema: str) -> None:
    rt = akter.SyncRuntime(
        actors=[Account], database_url=akter_db, schema=schema, drain_deadline=0.5
    )
    rt.start()
    HOLD.update(entered=threading.Event(), release=threading.Event())
    outcome: list[BaseException | int] = []

    def call() -> None:
        try:
            outcome.append(rt.get(Account, "a-12").call(Account.hold))
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert HOLD["entered"].wait(10)
    report = rt.stop()  # the turn never ends: the drain deadline cancels it
    HOLD["release"].set()
    caller.join()
    assert report.status == "deadline_expired" and report.interrupted_turns == 1
    (error,) = outcome
    assert isinstance(error, BaseException)
    assert committed_cents(akter_db, schema, "a-12") is None  # the turn rolled back


def test_a_failed_start_raises_the_runtimes_error_and_ends_the_thread(akter_db: str) -> None:
    rt = akter.SyncRuntime(actors=[Account], database_url="postgresql://postgres@127.0.0.1:1/x")
    with pytest.raises(Exception) as failed:
        rt.start()
    assert not isinstance(failed.value, SyncRuntimeError)
    assert not any(t.name == "akter-sync-runtime" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(SyncRuntimeError) as after:
        rt.get(Account, "a").call(Account.balance)
    assert after.value.reason == "stopped"


def test_a_forked_child_is_refused_and_the_parent_keeps_serving(
    rt: akter.SyncRuntime, akter_db: str, schema: str
) -> None:
    rt.get(Account, "fork").call(Account.deposit, cents=1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            rt.get(Account, "fork").call(Account.deposit, cents=100)
        except SyncRuntimeError as exc:
            try:
                rt.stop()  # nor may it stop (drain) the parent's runtime
            except SyncRuntimeError as again:
                os.write(write, f"{exc.reason}|{again.reason}|{exc}".encode())
                code = 0
        except BaseException as exc:  # pragma: no cover - reported to the parent
            os.write(write, f"other|{exc!r}".encode())
        finally:
            os._exit(code)  # no atexit, no finalizers: the parent's connections stay open
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, said
    reason, on_stop, message = said.split("|", 2)
    assert (reason, on_stop) == ("forked", "forked")
    assert f"started by process {os.getpid()}" in message
    assert rt.get(Account, "fork").call(Account.deposit, cents=1) == 2  # the parent is unharmed
    assert committed_cents(akter_db, schema, "fork") == 2


CTRL_C_CHILD = textwrap.dedent(
    """
    import asyncio, signal, sys, threading, time
    import akter
    from pydantic import BaseModel

    # "thread": the SIGINT lands on a bystander thread of the application, not the main one
    # (the kernel may pick any thread that does not block it); "process": the parent sends it.
    TO = sys.argv[3]
    # As in a terminal: a shell starts a background job (CI's, a test runner's) with SIGINT
    # ignored, which its children inherit, and Python then installs no KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    bystander = threading.Thread(target=time.sleep, args=(120,), daemon=True)
    bystander.start()

    class Count(BaseModel):
        n: int = 0

    class Gate(akter.Actor[Count], access=akter.public):
        @akter.command
        async def hold(self) -> int:
            print("entered", flush=True)
            if TO == "thread":
                signal.pthread_kill(bystander.ident, signal.SIGINT)
            await asyncio.sleep(60)
            return 0

    rt = akter.SyncRuntime(
        actors=[Gate], database_url=sys.argv[1], schema=sys.argv[2], drain_deadline=2
    )
    try:
        with rt:
            rt.get(Gate, "g").call(Gate.hold)
    except KeyboardInterrupt:
        print("drained", rt.last_drain.status, rt.last_drain.interrupted_turns, flush=True)
    """
)


@pytest.mark.parametrize("to", ["process", "thread"])
def test_ctrl_c_abandons_the_waiting_call_and_the_with_block_drains(
    akter_db: str, schema: str, to: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_CHILD, akter_db, schema, to],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "entered"
        if to == "process":
            child.send_signal(signal.SIGINT)
        # Well within the delivery timeout (30 s), which would end the wait otherwise.
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    # The caller stopped waiting; its turn ran on, as under ``asyncio.run``, until the drain's
    # deadline rolled it back.
    assert out.strip() == "drained deadline_expired 1", err
    with psycopg.connect(akter_db) as conn:
        runners = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.runners").format(sql.Identifier(schema))
        ).fetchone()
        actors = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.actors").format(sql.Identifier(schema))
        ).fetchone()
    assert runners == (0,)  # the drain deregistered the runner
    assert actors == (0,)  # and nothing of the interrupted turn committed


def test_a_staged_commands_outcome_is_read_by_its_id(
    rt: akter.SyncRuntime, akter_db: str, schema: str
) -> None:
    with psycopg.connect(akter_db) as conn, conn.transaction():
        cid = akter.stage(conn, Account, "staged", schema=schema).deposit(cents=7)
        refused = akter.stage(conn, Account, "staged", schema=schema).withdraw(cents=100)
    assert rt.outcome(cid, timeout=30) == 7
    with pytest.raises(Overdrawn) as declared:
        rt.get(Account, "staged").outcome(refused, timeout=30)
    assert declared.value.short == 93
    with psycopg.connect(akter_db) as conn, conn.transaction() as tx:
        never = akter.stage(conn, Account, "staged", schema=schema).deposit(cents=1)
        raise psycopg.Rollback(tx)
    with pytest.raises(akter.ActorError) as timeout:
        rt.outcome(never, timeout=0.3)
    assert timeout.value.reason == "Timeout"
    assert committed_cents(akter_db, schema, "staged") == 7


def test_stopping_under_many_calling_threads_leaves_none_hanging(
    akter_db: str, schema: str
) -> None:
    rt = akter.SyncRuntime(actors=[Account], database_url=akter_db, schema=schema)
    rt.start()
    threads = 8
    each_called = threading.Barrier(threads + 1)
    succeeded = [0] * threads
    ended: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            rt.call(Account.deposit, "many", 1)
            succeeded[n] += 1
            each_called.wait()
            while True:
                rt.call(Account.deposit, "many", 1)
                succeeded[n] += 1
        except BaseException as exc:
            ended.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    each_called.wait()
    reports: list[akter.DrainReport] = []
    stoppers = [threading.Thread(target=lambda: reports.append(rt.stop())) for _ in range(2)]
    for stopper in stoppers:
        stopper.start()
    for thread in [*pool, *stoppers]:
        thread.join()
    assert len(reports) == 2 and reports[0] == reports[1]  # one drain, reported to both
    assert len(ended) == threads
    for error in ended:  # refused by name, or by the draining runtime (retryable)
        assert isinstance(error, SyncRuntimeError | akter.ActorError), repr(error)
        if isinstance(error, SyncRuntimeError):
            assert error.reason == "stopped"
    # Every success committed; a call that ended in a refusal may have committed too.
    committed = committed_cents(akter_db, schema, "many")
    assert committed is not None
    assert sum(succeeded) <= committed <= sum(succeeded) + threads


def test_following_events_replays_then_blocks_for_live_commits(rt: akter.SyncRuntime) -> None:
    account = rt.create(Account)
    account.call(Account.deposit, cents=1)
    account.call(Account.deposit, cents=2)
    feed = account.follow()
    assert [next(feed).event, next(feed).event] == [Deposited(cents=1), Deposited(cents=2)]
    later = threading.Thread(target=account.call, args=(Account.deposit,), kwargs={"cents": 3})
    later.start()  # committed while the feed waits: delivered live
    third = next(feed)
    later.join()
    assert third.event == Deposited(cents=3)
    feed.close()  # closes the subscription on the loop too
    with pytest.raises(TimeoutError):
        for _ in account.follow(after=third.cursor, idle_timeout=0.2):
            pass
    assert [r.event for r in account.events(after=third.cursor)] == []


def test_sixteen_threads_through_a_pool_of_two_connections_all_commit(
    akter_db: str, schema: str
) -> None:
    # More calling threads than connections: the calls queue on the loop (the dispatcher and
    # the pool wait), none fails and none is lost.
    threads, calls = 16, 10
    with akter.SyncRuntime(
        actors=[Account], database_url=akter_db, schema=schema, pool_size=2, pool_wait=30
    ) as rt:
        start = threading.Barrier(threads)
        failures: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                start.wait()
                for _ in range(calls):
                    rt.get(Account, f"p-{n}").call(Account.deposit, cents=1)
            except BaseException as exc:
                failures.append(exc)

        pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    assert failures == []
    assert [committed_cents(akter_db, schema, f"p-{n}") for n in range(threads)] == [calls] * 16
