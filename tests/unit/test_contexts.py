"""The three contexts behind ``self`` (command, query, singleton loop), without a database.

Each is bound by the one ``bind``; staging records typed operations on a command's context and
is refused, with the same ``ReadOnlyError``, in a query and in a loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._staging import CancelJob, CancelTimer, StagedRow
from akter.actor import definition_of
from akter.callers import ActorRef, System, User
from akter.context import CommandContext, LoopContext, LoopLease, QueryContext, bind
from akter.errors import CapabilityEscaped, ReadOnlyError

NOW = 1_700_000_000_000


class Count(BaseModel):
    n: int = 0


class Box(akter.Actor[Count], name="ContextsBox", execution_timeout=7):
    @akter.command
    async def add(self, by: int) -> int:
        return by

    @akter.job()
    async def work(call: akter.JobCall, req: Count) -> None:
        return None


BOX = definition_of(Box)
REF = ActorRef("t1", BOX.name, "b-1")


def _command() -> CommandContext:
    return CommandContext(
        definition=BOX,
        ref=REF,
        caller=User("alice"),
        command_id="v1.1.2.c",
        now_ms=NOW,
        state=Count(n=1),
        window_ms=1_000,
    )


def _query() -> QueryContext:
    async def reader(after: str | None, limit: int) -> Any:
        return []

    return QueryContext(
        definition=BOX,
        ref=REF,
        caller=User("alice"),
        now_ms=NOW,
        state=Count(n=1),
        cursor=5,
        events_reader=reader,
    )


def _loop(lease: LoopLease | None = None) -> LoopContext:
    return LoopContext(
        definition=BOX,
        ref=REF,
        caller=System("process"),
        now_ms=NOW,
        runtime="the runtime",
        runner_id="r-1",
        lease=lease,
    )


def _inside(ctx: Any, use: Any) -> Any:
    """Run ``use(self)`` inside an active handler task bound to ``ctx``."""

    async def handler() -> Any:
        instance = bind(ctx)
        ctx.activate()
        try:
            return use(instance)
        finally:
            ctx.active = False

    return asyncio.run(handler())


def test_a_command_stages_typed_operations_in_order() -> None:
    ctx = _command()

    def stage(self: Box) -> None:
        self.send(Box.add, "b-2", 1)
        self.later(after=2, key="k").send(Box.add, "b-3", by=2)
        self.cancel_timer("k")
        self.enqueue(Box.work, Count(), key="w")
        self.cancel_job("w")

    _inside(ctx, stage)
    kinds = [type(op).__name__ for op in ctx.staged.ops]
    assert kinds == [
        "StagedRow",
        "CancelTimer",
        "StagedRow",
        "CancelTimer",
        "CancelJob",
        "StagedRow",
        "CancelJob",
    ]
    send, timer, job = (op for op in ctx.staged.ops if isinstance(op, StagedRow))
    assert (send.target_id, send.delay_ms, send.at_ms, send.timer_key) == ("b-2", 0, None, None)
    assert (timer.delay_ms, timer.timer_key) == (2_000, "k")
    assert (job.kind, job.timer_key, job.delay_ms) == ("job", "$job:w", None)
    assert ctx.staged.ops[1] == CancelTimer("k") and ctx.staged.ops[4] == CancelJob("$job:w")
    # Framework ids: an immediate intent has no slack, a timer and a job the execution timeout.
    expiry = [int(row.intent_id.split(".")[2]) for row in (send, timer, job)]
    assert expiry == [NOW + 1_000, NOW + 2_000 + 7_000 + 1_000, NOW + 7_000 + 1_000]


@pytest.mark.parametrize(
    "stage",
    [
        lambda self: self.send(Box.add, "b-2", 1),
        lambda self: self.later(after=1),
        lambda self: self.enqueue(Box.work, Count()),
        lambda self: self.emit(akter.Event()),
        lambda self: self.cancel_timer("k"),
        lambda self: self.mint(Box),
        lambda self: setattr(self, "state", Count()),
    ],
)
@pytest.mark.parametrize("make", [_query, _loop])
def test_queries_and_loops_refuse_staging(make: Any, stage: Any) -> None:
    with pytest.raises(ReadOnlyError, match=r"is not available in a query: queries are read-only"):
        _inside(make(), stage)


def test_a_query_reads_a_read_only_state_and_its_cursor() -> None:
    def read(self: Box) -> Any:
        with pytest.raises(ReadOnlyError):
            self.state.n = 2
        with pytest.raises(ReadOnlyError, match="Queries have no command id"):
            _ = self.command_id
        with pytest.raises(ReadOnlyError, match=r"run\(\) loop"):
            _ = self.runtime
        return self.state.n, self.cursor, self.principal, self.now_ms

    assert _inside(_query(), read) == (1, "5", "alice", NOW)


def test_a_loop_has_a_runtime_and_a_lease_but_no_state() -> None:
    lease = LoopLease(BOX.name, "r-1", 3, 7)

    def read(self: Box) -> Any:
        with pytest.raises(ReadOnlyError, match="A singleton loop has no state"):
            _ = self.state
        return self.lease

    assert _inside(_loop(lease), read) == lease
    assert _inside(_loop(), lambda self: self.runtime) == "the runtime"
    with pytest.raises(ReadOnlyError, match=r"self\.lease exists only"):
        _inside(_loop(), lambda self: self.lease)


def test_a_capability_used_after_the_handler_is_refused() -> None:
    ctx = _command()
    kept = _inside(ctx, lambda self: self)
    with pytest.raises(CapabilityEscaped):
        kept.send(Box.add, "b-2", 1)
    assert ctx.staged.ops == []
