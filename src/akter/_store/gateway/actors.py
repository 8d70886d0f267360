"""The actor statements of a turn: every parameter dict of its two flights.

Each function queues one or two statements on the connection's turn pipeline
(:func:`turn_pipeline`, ``akter._store.pipeline``); nothing here waits for the server or reads a
result itself, so the flights stay two round trips (see ``akter._engine.turn``). The statements,
their parameters and their order are the turn's: ``key`` is the actor's
``{"rk", "tenant", "type", "id"}`` (:func:`actor_key`), ``off`` the clock offset in ms.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import adapt, pq
from psycopg._encodings import conn_encoding
from psycopg.abc import AdaptContext
from psycopg.rows import dict_row

from akter._store import citus
from akter._store.gateway import citus_writes
from akter._store.gateway.errors import wrap_errors
from akter._store.pipeline import Answer, Statements, TurnPipeline
from akter._store.pool import Clock, Connection, Store, TurnConnection
from akter._store.queries import Queries

Key = Mapping[str, Any]
#: A statement's named parameters (a fence, ticks, receipts): values to send, never a row.
Params = Mapping[str, Any]
#: Where a turn's statements are queued, and what each returns once its flight was synced.
Executor = Statements
Cursor = Answer


class TextArray(list[str | None]):
    """A ``text[]`` parameter of a turn statement, dumped by :class:`_TextArrayDumper`."""


class BigintArray(list[int]):
    """A ``bigint[]`` parameter of a turn statement, dumped by :class:`_BigintArrayDumper`."""


_ARRAY_HEAD = struct.Struct("!iiIii")  # ndim, has nulls, element oid, length, lower bound
_EMPTY_HEAD = struct.Struct("!iiI")  # no dimensions
_INT4 = struct.Struct("!i")
_INT8 = struct.Struct("!iq")  # an element's length (8) and its value
_TEXT_OID, _INT8_OID = 25, 20


def _binary_array(oid: int, size: int, has_null: bool, elements: Iterable[bytes]) -> bytes:
    if not size:
        return _EMPTY_HEAD.pack(0, 0, oid)
    return _ARRAY_HEAD.pack(1, has_null, oid, size, 1) + b"".join(elements)


class _TextArrayDumper(adapt.Dumper):
    """A ``text[]`` in binary without psycopg's per-dump scan of the list for its element type.

    psycopg's list dumper finds the element type on every dump (the key of its cache) and
    quotes each element of the text form with regular expressions: about 20 calls per array
    parameter, seven array parameters per warm turn.
    """

    format = pq.Format.BINARY
    oid = 1009  # text[]

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        encoding = conn_encoding(self.connection)  # as psycopg's own str dumper
        self._encoding = encoding if encoding != "ascii" else "utf-8"

    def dump(self, obj: Any) -> bytes:
        parts: list[bytes] = []
        has_null = False
        for item in obj:
            if item is None:
                has_null = True
                parts.append(b"\xff\xff\xff\xff")
            else:
                data = item.encode(self._encoding)
                parts.append(_INT4.pack(len(data)))
                parts.append(data)
        return _binary_array(_TEXT_OID, len(obj), has_null, parts)


class _BigintArrayDumper(adapt.Dumper):
    """A ``bigint[]`` in binary (see :class:`_TextArrayDumper`)."""

    format = pq.Format.BINARY
    oid = 1016  # bigint[]

    def dump(self, obj: Any) -> bytes:
        return _binary_array(_INT8_OID, len(obj), False, [_INT8.pack(8, v) for v in obj])


_ARRAY_DUMPERS: dict[type, type] = {TextArray: _TextArrayDumper, BigintArray: _BigintArrayDumper}


def turn_pipeline(conn: Connection) -> TurnPipeline:
    """The turn pipeline of ``conn``: kept on a pooled connection, made afresh on any other.

    Its array parameters (:class:`TextArray`, :class:`BigintArray`) are dumped in binary.
    """
    if isinstance(conn, TurnConnection):
        if conn.turn_pipeline is None:
            conn.turn_pipeline = TurnPipeline(conn, _ARRAY_DUMPERS)
        return conn.turn_pipeline
    return TurnPipeline(conn, _ARRAY_DUMPERS)


def actor_key(routing_key: int, tenant: str, actor_type: str, actor_id: str) -> Key:
    """The parameters that address one actor row."""
    return {"rk": routing_key, "tenant": tenant, "type": actor_type, "id": actor_id}


def _ms_text(ms: int) -> str:
    return f"{max(ms, 1)}ms"


# --- flight 1: admission ------------------------------------------------------------------------


def turn_settings(
    *,
    lock_wait_ms: int,
    statement_timeout_ms: int,
    bound_setting: str,
    bound_ms: int,
    generic_plans: bool,
) -> dict[str, str | None]:
    """The parameters of a turn's transaction-local timeouts and plan cache mode.

    ``bound_setting`` ends a frozen session. They are the same for every turn of a type, so the
    engine builds them once per type.

    ``generic_plans`` sets ``plan_cache_mode`` to ``force_generic_plan`` for the rest of the
    turn's transaction (else the session's mode stays). A statement with an array parameter
    (``admission_read``'s command ids, ``insert_outbox``'s rows) has a generic plan estimated
    for 10 elements (an array of unknown length), against its real length in a custom plan, so
    under ``auto`` PostgreSQL re-plans it on every execution, which costs more server time than
    running it. Every statement after ``lock_actor`` is a keyed lookup or write whose plan does
    not depend on the values.
    """
    return {
        "lock_timeout": _ms_text(lock_wait_ms),
        "statement_timeout": _ms_text(statement_timeout_ms),
        "bound_setting": bound_setting,
        "bound": _ms_text(bound_ms),
        "plan_cache_mode": "force_generic_plan" if generic_plans else None,
    }


async def begin_turn(conn: Executor, q: Queries, settings: Key | None) -> None:
    """``BEGIN``; with ``settings``, also ``turn_settings``.

    Only a cold turn needs them before ``ensure_actor``: a warm turn's ``lock_actor`` sets them.
    """
    await conn.execute("BEGIN")
    if settings is not None:
        await conn.execute(q["turn_settings"], settings)


def worker_lock_wait(q: Queries, lock_wait_ms: int) -> bytes:
    """A type's ``citus_lock_wait`` for :func:`bound_worker_locks` (built once per type)."""
    return citus.worker_lock_wait(q, lock_wait_ms)


async def bound_worker_locks(conn: Executor, q: Queries, lock_wait: bytes) -> None:
    """On Citus, right after ``BEGIN``: the turn's lock wait, also on the actor's worker.

    ``lock_wait`` is the type's ``citus_lock_wait`` (:func:`akter._store.citus.worker_lock_wait`):
    the row lock waits in the actor's shard, where ``lock_actor``'s ``set_config`` does not reach.
    """
    await citus.bound_worker_locks(conn, q, lock_wait)


def ensure_actor(
    conn: Executor, q: Queries, key: Key, state_json: str, state_version: int, off: int
) -> Awaitable[Cursor]:
    """Insert the row of an actor the cache does not know (an existing row is left alone).

    ``state_json`` is the type's default state, stored at the code's ``state_version``.
    """
    return conn.execute(
        q["ensure_actor"], {**key, "state": state_json, "state_version": state_version, "off": off}
    )


def lock_actor(
    conn: Executor, q: Queries, key: Key, cached_version: int | None, settings: Key
) -> Awaitable[Cursor]:
    """Set the turn's timeouts and plan mode (:func:`turn_settings`), then lock the actor row.

    Its state is shipped only when ``cached_version`` is stale.
    """
    return conn.execute(q["lock_actor"], {**key, **settings, "cached_version": cached_version})


def lock_admit(
    conn: Executor,
    q: Queries,
    key: Key,
    cached_version: int | None,
    settings: Key,
    off: int,
    command_ids: list[str],
) -> Awaitable[Cursor]:
    """:func:`lock_actor` and :func:`read_admission` in one statement (not on Citus).

    Its row: the locked row's five columns, then the pinned clock and the receipts of
    ``command_ids`` (``None`` when none is stored), both read once the lock is granted.
    """
    return conn.execute(
        q["lock_admit"],
        {
            **key,
            **settings,
            "cached_version": cached_version,
            "off": off,
            "command_ids": TextArray(command_ids),
        },
    )


def read_clock(conn: Executor, q: Queries, off: int) -> Awaitable[Cursor]:
    """The turn's one clock reading as a statement of its own (on Citus: the coordinator's)."""
    return conn.execute(q["clock_now"], {"off": off})


def read_admission(
    conn: Executor, q: Queries, key: Key, off: int, command_ids: list[str]
) -> Awaitable[Cursor]:
    """The pinned clock and the receipts of ``command_ids``, in a snapshot after the lock."""
    return conn.execute(
        q["admission_read"], {**key, "off": off, "command_ids": TextArray(command_ids)}
    )


#: Receipts as the admission read returns them: JSON objects (``command_id``, ``command``,
#: ``payload_hash``, ``caller_key``, ``outcome``, ``expires_at_ms``).
StoredReceipts = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class LockedActor:
    """The actor row a turn's lock returned (``lock_actor``; ``lock_admit``'s first columns).

    ``state`` (the stored document) and ``state_version`` are shipped only when the turn's
    cached version is stale; ``None`` otherwise.
    """

    version: int
    created: bool
    event_seq: int
    state: Any
    state_version: int | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LockedActor:
        """The locked row from ``lock_actor``'s (or ``lock_admit``'s) row."""
        version, created, event_seq, state, state_version = row[:5]
        return cls(int(version), bool(created), int(event_seq), state, state_version)


@dataclass(frozen=True, slots=True)
class AdmissionRead:
    """A turn's pinned clock and the stored receipts of its batch's ids (``admission_read``)."""

    now_ms: int
    receipts: StoredReceipts

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> AdmissionRead:
        """The read from ``admission_read``'s row (``lock_admit``'s after the lock's five)."""
        return cls(int(row[0]), row[1] or [])  # NULL: none stored


async def admission_answers(
    lock: Cursor, read: Cursor | None, apart: bool = False
) -> tuple[LockedActor | None, AdmissionRead | None]:
    """The locked row and the admission read, from their own answers or ``lock_admit``'s one.

    ``None``, ``None`` when the row is missing (``lock_admit``); with ``read`` its answer is
    read whether or not the row was found. ``apart`` (Citus): ``lock`` is ``lock_actor``'s
    answer, and without ``read`` there is no admission read.
    """
    row = await lock.fetchone()
    locked = None if row is None else LockedActor.from_row(row)
    if read is not None:
        answer = await read.fetchone()
        return locked, None if answer is None else AdmissionRead.from_row(answer)
    return locked, None if row is None or apart else AdmissionRead.from_row(row[5:])


async def clock_answer(cur: Cursor) -> int:
    """The clock reading of :func:`read_clock`'s answer (``now_ms``)."""
    row = await cur.fetchone()
    assert row is not None  # a table-less statement: always one row
    return int(row[0])


async def fence_answer(cur: Cursor) -> int | None:
    """A :func:`check_fence` answer: the lease's end while it is still the loop's, else None."""
    row = await cur.fetchone()
    return None if row is None else int(row[0])


async def cancelled_jobs(cur: Cursor) -> list[tuple[str, bool]]:
    """A :func:`cancel_jobs` answer: ``(job id, an attempt was running)`` per cancelled job."""
    return [(str(r[0]), bool(r[1])) for r in await cur.fetchall()]


def fence_params(actor_type: str, owner: str, epoch: int, routing_key: int) -> Params:
    """A singleton loop's lease: its type, owner, epoch and row's routing key."""
    return {"actor_type": actor_type, "owner": owner, "epoch": epoch, "rk": routing_key}


def check_fence(conn: Executor, q: Queries, fence: Params) -> Awaitable[Cursor]:
    """A loop's lease row (:func:`fence_params`) if still its (its ``lease_until_ms``), or none."""
    return conn.execute(q["check_singleton_fence"], fence)


# --- flight 2: commit ---------------------------------------------------------------------------


def hold_fence(
    conn: Executor, q: Queries, fence: Params, now_ms: int, off: int
) -> Awaitable[Cursor]:
    """Hold a loop's lease row through ``COMMIT`` if current, else fail the flight.

    Current: not ended at ``now_ms`` (the turn's estimate) nor at the server's clock (offset
    ``off``) as the check runs; on Citus at the estimate only (``citus_hold_singleton_fence``),
    and :func:`hold_fence_clock` after it reads the coordinator's clock.
    """
    return conn.execute(q["hold_singleton_fence"], {**fence, "now": now_ms, "off": off})


def hold_fence_clock(
    conn: Executor, q: Queries, lease_until_ms: int, off: int
) -> Awaitable[Cursor]:
    """Fail the flight unless the framework clock, read now, is before ``lease_until_ms``.

    A statement on no table: on Citus the coordinator runs it, with the clock the leases are
    written at, where :func:`hold_fence` runs in the lease's shard on a worker.
    """
    return conn.execute(q["hold_fence_clock"], {"lease_until": lease_until_ms, "off": off})


def update_actor(
    conn: Executor,
    q: Queries,
    key: Key,
    *,
    state_json: str | None,
    state_version: int,
    created: bool,
    event_seq: int,
    now_ms: int,
    locked_version: int,
    receipts: Mapping[str, Any] | None = None,
    rows_apart: bool = False,
) -> Awaitable[Cursor]:
    """The guarded update of the actor row (its version must still be ``locked_version``).

    With ``receipts`` the same statement writes them too: a warm turn's writes are one
    statement. :func:`receipt_params` of several receipts go to ``update_actor_receipts``,
    :func:`one_receipt_params` to ``update_actor_receipt``. With ``rows_apart`` (Citus):
    ``update_actor``, then an insert per receipt (``citus_writes``).
    """
    params = {
        **key,
        "state": state_json,
        "state_version": state_version,
        "created": created,
        "event_seq": event_seq,
        "now": now_ms,
        "locked_version": locked_version,
    }
    if receipts is None:
        return conn.execute(q["update_actor"], params)
    if rows_apart:
        return citus_writes.update_then_receipts(conn, q, params, key, receipts)
    if "command_id" in receipts:  # one_receipt_params
        return conn.execute(q["update_actor_receipt"], {**params, **receipts})
    return conn.execute(q["update_actor_receipts"], {**params, **receipts})


def tick_params(
    key: Key,
    *,
    bucket: int,
    caller: str,
    intent_ids: list[str],
    commands: list[str],
    dues: list[int],
    keys: list[str],
    versions: list[int] | None = None,
) -> Params:
    """Parameters of ``insert_ticks``: one pending tick per schedule entry of the actor."""
    return {
        **key,
        "bucket": bucket,
        "caller": caller,
        "intent_ids": intent_ids,
        "commands": commands,
        "dues": dues,
        "keys": keys,
        "versions": versions if versions is not None else [0] * len(keys),
    }


def insert_ticks(conn: Executor, q: Queries, params: Mapping[str, Any]) -> Awaitable[Cursor]:
    """Insert the ticks of :func:`tick_params` (existing ones are left alone)."""
    return conn.execute(q["insert_ticks"], params)


def receipt_params(
    *,
    command_ids: list[str],
    commands: list[str],
    payload_hashes: list[str],
    caller_keys: list[str],
    outcomes: list[str | None],
    expires: list[int],
) -> Params:
    """The receipts of the batch's commands (outcomes as stored JSON text), as parameters."""
    return {
        "command_ids": TextArray(command_ids),
        "commands": TextArray(commands),
        "payload_hashes": TextArray(payload_hashes),
        "caller_keys": TextArray(caller_keys),
        "outcomes": TextArray(outcomes),
        "expires": BigintArray(expires),
    }


def one_receipt_params(
    *,
    command_id: str,
    command: str,
    payload_hash: str,
    caller_key: str,
    outcome: str,
    expires: int,
) -> Params:
    """One receipt as scalar parameters (``update_actor_receipt``; see :func:`receipt_params`)."""
    return {
        "command_id": command_id,
        "command": command,
        "payload_hash": payload_hash,
        "caller_key": caller_key,
        "outcome": outcome,
        "expires_at_ms": expires,
    }


def insert_receipts(
    conn: Executor, q: Queries, key: Key, receipts: Mapping[str, Any], *, rows_apart: bool = False
) -> Awaitable[Cursor | None]:
    """Write the receipts of :func:`receipt_params` (when the batch updates no state).

    ``rows_apart`` (Citus): one routed statement per receipt (``citus_writes``).
    """
    if rows_apart:
        return citus_writes.receipts_apart(conn, q, key, receipts)
    return conn.execute(q["insert_receipts"], {**key, **receipts})


def end_turn(conn: Executor, commit: bool) -> Awaitable[Cursor]:
    """``COMMIT`` (or ``ROLLBACK`` when the turn writes nothing); its status is the cursor's."""
    return conn.execute("COMMIT" if commit else "ROLLBACK")


@dataclass(frozen=True, slots=True)
class CommittedActor:
    """An actor's committed row as a query reads it (``query_actor``).

    ``state``: the stored state document (decoded JSON), at ``state_version``.
    """

    version: int
    created: bool
    event_seq: int
    state: Any
    state_version: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CommittedActor:
        """The actor from ``query_actor``'s row."""
        return cls(
            version=int(row["version"]),
            created=bool(row["created"]),
            event_seq=int(row["event_seq"]),
            state=row["state"],
            state_version=int(row["state_version"] or 0),
        )


async def committed(
    store: Store, clock: Clock, key: Key, *, wait_s: float, what: str
) -> tuple[CommittedActor | None, int]:
    """A query's read: the actor's committed row (or ``None``) and the framework clock.

    Unlocked, on one pooled connection waited for at most ``wait_s`` (then ``pool_exhausted``).
    """
    with wrap_errors(store, wait_s=wait_s, what=what):
        async with store.pool.connection(timeout=wait_s) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(store.queries["query_actor"], key)
            row = await cur.fetchone()
            now_ms = await clock.read_on(conn)
    return (None if row is None else CommittedActor.from_row(row)), now_ms
