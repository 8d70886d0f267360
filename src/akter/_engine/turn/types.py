"""The values a turn works with: requests, results, the actor's cache and the staged writes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from akter import _ids, telemetry
from akter._contexts import LoopLease
from akter._ids import CommandId, bucket
from akter._kinds import RowKind
from akter._retry import Backoff
from akter._staging import (
    CancelJob,
    CancelTimer,
    Staged,
    StagedBroadcast,
    StagedEvent,
    StagedFollow,
    StagedRow,
    StagedRun,
)
from akter._store.pool import Connection
from akter.actor import ActorDefinition, Member
from akter.callers import ActorRef, Caller, caller_key

#: The most a batch's events may total, in bytes of stored JSON.
EVENT_BYTES_LIMIT = 1_048_576
#: The most commands one batch carries.
BATCH_LIMIT = 32
#: An actor's wait before its next batch after ``ActorUnavailable``: first, then doubling to max.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 5.0
#: The server ends a turn's session this long after its execution timeout (see ``engine``).
SERVER_BOUND_GRACE_MS = 1_000


@dataclass
class Request:
    """One command waiting in an actor's mailbox."""

    member: Member
    ref: ActorRef
    payload: dict[str, Any]
    #: ``payload_hash(payload)``, or ``None`` until :meth:`digest` makes it: the turn makes it
    #: while its admission flight is out (``Prepared.fill``), before any handler runs.
    payload_hash: str | None
    command_id: CommandId
    caller: Caller
    external: bool
    future: asyncio.Future[Result]
    enqueued_at: float = field(default_factory=time.monotonic)
    #: A singleton loop's lease: the turn refuses the command unless it is still current.
    fence: LoopLease | None = None
    #: The caller's OpenTelemetry context: the batch span becomes a child of the first request's.
    trace_context: Any = field(default_factory=telemetry.current_context)
    #: Set once a commit flight carrying this command was sent: only then can a failure leave
    #: its outcome unknown (an ``ActorUnavailable`` coded ``outcome_unknown``).
    commit_sent: bool = False
    #: The command id was minted for this call and is submitted for the first time: no receipt
    #: of it can exist, so the admission does not probe for one (``Calls.command``). A retry,
    #: a pinned id and every delivery are probed.
    unseen: bool = False
    #: A relay delivery's first attempt of an intent an actor's turn or a job's settle wrote:
    #: it may take the one flight (its id is probed there, by the guard: ``AK002`` falls back
    #: to the two-flight turn, which replays). ``docs/internals/one-flight-turn.md``.
    first_delivery: bool = False

    def digest(self) -> str:
        """The payload's hash, as its receipt stores it (made once; ``payload`` is validated)."""
        made = self.payload_hash
        if made is None:
            made = self.payload_hash = _ids.payload_hash(self.payload)
        return made

    @property
    def caller_key(self) -> str:
        """The caller key stored in receipts."""
        return caller_key(self.caller)


@dataclass
class Result:
    """What one command's turn produced, as the caller will see it."""

    kind: Literal["ok", "declared", "error"]
    value: Any = None
    error: BaseException | None = None
    replayed: bool = False


class BatchDefect(Exception):
    """A defect aborted a batch: its commands are re-run one per transaction."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


class Retryable(Exception):
    """The batch failed in a retryable way."""


class LiveKeyTaken(Exception):
    """A keyed workflow start of the batch met a live run of its key in the commit flight.

    The server rolled the batch back; the engine runs it once more knowing the live runs.
    """


@dataclass
class Activation:
    """The in-memory cache of one actor: a cache only, never an authority."""

    definition: ActorDefinition
    ref: ActorRef
    routing_key: int
    exists: bool = False
    version: int | None = None
    #: The state as its stored JSON text: the cache keeps no decoded model, each handler
    #: decodes its own (docs/internals/state-cache.md).
    state_json: str | None = None
    #: The model the last load decoded from the stored row, given to no handler yet: the next
    #: handler takes it instead of decoding ``state_json`` (it is what a cold load decodes).
    loaded: BaseModel | None = None
    state_version: int = 0
    created: bool = False
    event_seq: int = 0
    last_used: float = field(default_factory=time.monotonic)
    #: The wait before this actor's next batch after an unavailable store (doubling).
    backoff: Backoff = field(default_factory=lambda: Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S))
    ticks_ensured: bool = False
    #: The pooled connection this actor's mailbox worker kept from its last batch for its next,
    #: and when it was taken from the pool (``TurnEngine.run``; back when the worker ends).
    held: tuple[Connection, float] | None = None

    @property
    def bucket(self) -> int:
        """The actor's bucket (``routing_key >> 56``)."""
        return bucket(self.routing_key)

    def drop_cache(self) -> None:
        """Forget everything cached: the next turn reloads from the database."""
        self.exists = False
        self.version = None
        self.state_json = None
        self.loaded = None


@dataclass
class Outcome:
    """Per command: the receipt to write (its stored JSON text, if any) and the caller's result."""

    result: Result
    receipt: str | None = None
    expires_ms: int = 0
    #: A successful handler's new state, as stored JSON text.
    state_json: str | None = None
    #: The command whose reply ``result`` still lacks: its value is decoded from ``receipt``
    #: while the commit flight is out (``invoke.decode_replies``).
    reply: Member | None = None


@dataclass
class BatchWrites:
    """Staged work of the batch's successful commands, merged in order."""

    events: list[tuple[StagedEvent, str]] = field(default_factory=list)  # event, command id
    rows: list[StagedRow] = field(default_factory=list)
    timer_deletes: list[str] = field(default_factory=list)
    job_cancels: list[str] = field(default_factory=list)
    #: Workflow runs the batch starts on its actor (written in the commit flight).
    runs: list[StagedRun] = field(default_factory=list)
    #: The run each (workflow, key) names for the batch's later commands: the live runs the
    #: admission read (only when the batch is re-run after a start met a live key), then the
    #: keyed runs its earlier commands started. ``None`` while there is none (most batches).
    keyed: dict[tuple[str, str], str] | None = None
    #: Broadcasts, sent after the commit (never written: best-effort, docs/guides/live.md).
    broadcasts: list[StagedBroadcast] = field(default_factory=list)
    #: Dynamic subscriptions the batch starts or stops (the subscriptions spec).
    follows: list[StagedFollow] = field(default_factory=list)
    #: The commit flight wrote subscription feeds or follows: the subscription lane has work.
    fed: bool = False

    def apply(self, staged: Staged, command_id: str) -> None:
        """Merge one successful command's staged work (the last staging of a key wins)."""
        for event in staged.events:
            self.events.append((event, command_id))
        self.broadcasts += staged.broadcasts
        for op in staged.ops:
            if isinstance(op, StagedRow):
                self.rows.append(op)
            elif isinstance(op, StagedRun):
                self.runs.append(op)
                if op.key is not None:
                    # A later command's start of the key returns this run's id (context.py).
                    if self.keyed is None:
                        self.keyed = {}
                    self.keyed[(op.workflow, op.key)] = op.run_id
            elif isinstance(op, StagedFollow):
                self.follows.append(op)
            elif isinstance(op, CancelTimer):
                # A cancellation drops earlier stagings of the key.
                key = op.key
                self.rows = [
                    r for r in self.rows if not (r.kind == RowKind.INTENT and r.timer_key == key)
                ]
                if key not in self.timer_deletes:
                    self.timer_deletes.append(key)
            elif isinstance(op, CancelJob):
                key = op.key
                self.rows = [
                    r for r in self.rows if not (r.kind == RowKind.JOB and r.timer_key == key)
                ]
                if key not in self.job_cancels:
                    self.job_cancels.append(key)

    @property
    def empty(self) -> bool:
        """Whether nothing was staged."""
        return not (
            self.events
            or self.rows
            or self.timer_deletes
            or self.job_cancels
            or self.runs
            or self.follows
        )


@dataclass
class BatchRun:
    """The batch after its decisions and handlers: outcomes, and the state the commit writes."""

    outcomes: list[Outcome]
    writes: BatchWrites
    #: The state after the batch's successful commands, as stored JSON (None: not decodable).
    state_json: str | None
    created: bool
    event_seq: int
