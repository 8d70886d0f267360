"""Commands staged in the application's own transaction: the statements, without the I/O.

``akter.stage`` runs on whatever connection the application holds (psycopg, SQLAlchemy, Django;
sync or async), so this module does no I/O: :func:`plan` is a generator that yields each
statement as ``(sql, params)`` and is sent back its rows (a list of dicts); the caller's driver
(``akter.staging``) runs them on the application's connection. Its return value is the
staged ids, in order.

The flow (docs/guides/own-transaction.md):

1. Only when some ids are pinned: ``stage_probe`` reads, in a fresh snapshot, the deployment's
   window and clock and what already holds each pinned id (its pending outbox row, its receipt
   on the target actor). Same command, payload and target: a no-op (the id is returned, nothing
   written). Anything else: ``CommandConflict``, nothing written. A pinned id whose span is not
   the deployment's window, or that has expired, is refused (``InvalidCommandId`` /
   ``CommandExpired``).
2. ``stage_intents`` inserts the rest in one statement (ids minted in SQL from the statement
   clock and the deployment's retry window). A pinned row that another transaction committed
   between 1 and 2 is not inserted (``ON CONFLICT DO NOTHING``, after waiting for that
   transaction); it is probed once more and compared, as in 1.

Nothing is written unless the deployment row exists at the code's schema version or later; a schema
that does not exist raises from the database (the caller's driver names it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from akter._ids import parse_command_id
from akter._kinds import TRANSACTION_SOURCE
from akter._store.queries import Queries
from akter.errors import ActorError, ConfigurationError

#: One statement to run: its text and parameters.
Statement = tuple[str, dict[str, Any]]
#: A statement's rows, as dicts by column name.
Rows = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class StageRow:
    """One command (or workflow start) to stage, validated; plain values only.

    Attributes:
        rk: The target actor's routing key (the row's shard on Citus).
        payload: The stored JSON payload; ``payload_hash`` its digest (the receipt's).
        caller: The stored caller JSON; ``caller_key`` its receipt key.
        pinned: The caller's command id, or ``None`` to mint one in SQL.
        suffix: Appended to the id: a workflow start's ``~<actor digest>`` (its run id).
        delay: ``after=`` in ms, or ``None``; ``at``: ``at=`` in epoch ms, or ``None``.
        slack: The target's execution timeout in ms: added to a relative id's expiry.
    """

    rk: int
    tenant: str
    type: str
    id: str
    command: str
    payload: str
    payload_hash: str
    version: int
    caller: str
    caller_key: str
    pinned: str | None
    suffix: str
    delay: int | None
    at: int | None
    slack: int


def plan(
    queries: Queries, rows: Sequence[StageRow], min_version: int
) -> Generator[Statement, Rows, list[str]]:
    """Stage ``rows`` (module docstring): yields statements, returns the ids in order.

    ``min_version`` is the schema version the code needs (``akter._store.migrate``'s).
    """
    ids: list[str | None] = [None] * len(rows)
    pinned = [i for i, r in enumerate(rows) if r.pinned is not None]
    if pinned:
        found = yield _probe(queries, rows, pinned)
        for i in _compare(rows, pinned, _deployment(found, min_version), check_ids=True):
            ids[i] = _intent_id(rows[i])
    todo = [i for i, r in enumerate(rows) if ids[i] is None]
    if todo:
        result = _deployment((yield _insert(queries, rows, todo, min_version)), min_version)
        raced: list[int] = []
        for i, intent_id, inserted in zip(
            todo, result["intent_ids"], result["inserted"], strict=True
        ):
            ids[i] = str(intent_id)
            if not inserted:
                raced.append(i)
        if raced:
            found = yield _probe(queries, rows, raced)
            missing = set(raced) - set(
                _compare(rows, raced, _deployment(found, min_version), check_ids=False)
            )
            if missing:
                # Not inserted, yet neither a row nor a receipt holds it: deleted meanwhile.
                raise ActorError(
                    "CommandConflict",
                    f"Command id {rows[min(missing)].pinned!r} was delivered while this "
                    "staging ran; stage it again to compare with its receipt.",
                    retryable=True,
                )
    return [str(i) for i in ids]


def _intent_id(row: StageRow) -> str:
    assert row.pinned is not None
    return row.pinned + row.suffix


def _deployment(rows: Rows, min_version: int) -> dict[str, Any]:
    """The statement's one row, or the refusal of a schema without a (current) deployment."""
    if not rows:
        raise ConfigurationError(
            "The akter schema has no deployment row: start a runtime (or run `akter migrate`) "
            "against this database and schema before staging commands."
        )
    row = rows[0]
    if int(row["schema_version"]) < min_version:
        raise ConfigurationError(
            f"The akter schema is at version {row['schema_version']}, older than this code's "
            f"{min_version}: migrate it (start a runtime of this version) before staging."
        )
    return row


def _compare(
    rows: Sequence[StageRow], which: list[int], probe: dict[str, Any], *, check_ids: bool
) -> list[int]:
    """The pinned rows already staged with the same command (no-ops); raises on a conflict."""
    found = probe["found"]
    if isinstance(found, str):  # a driver that leaves jsonb as text (Django's)
        found = json.loads(found)
    pending = {(h["rk"], h["id"]): h for h in found if h["what"] == "row"}
    receipts = {
        (h["rk"], h["tenant"], h["type"], h["actor_id"], h["id"]): h
        for h in found
        if h["what"] == "receipt"
    }
    same: list[int] = []
    for i in which:
        row = rows[i]
        assert row.pinned is not None
        if check_ids:
            _check_pinned(row.pinned, int(probe["window_ms"]), int(probe["now"]))
        held = pending.get((row.rk, _intent_id(row)))
        receipt = receipts.get((row.rk, row.tenant, row.type, row.id, row.pinned))
        if held is not None:
            mine = (row.tenant, row.type, row.id, row.command, row.payload)
            if (
                held["tenant"],
                held["type"],
                held["actor_id"],
                held["command"],
                held["payload"],
            ) != mine:
                raise _conflict(row.pinned)
            same.append(i)
        elif receipt is not None:
            if (receipt["command"], receipt["payload_hash"]) != (row.command, row.payload_hash):
                raise _conflict(row.pinned)
            if receipt["caller_key"] != row.caller_key:
                raise ActorError(
                    "Unauthorized",
                    f"Command id {row.pinned!r} belongs to another caller.",
                    code="receipt_access_denied",
                    command_id=row.pinned,
                )
            same.append(i)
    return same


def _check_pinned(pinned: str, window_ms: int, now_ms: int) -> None:
    parsed = parse_command_id(pinned, window_ms)
    if now_ms >= parsed.expires_ms:
        raise ActorError(
            "CommandExpired",
            f"Command id {pinned!r} has expired; mint a new id to stage a new command.",
            command_id=pinned,
        )


def _conflict(pinned: str) -> ActorError:
    return ActorError(
        "CommandConflict",
        f"Command id {pinned!r} was already staged for a different command, actor or payload; "
        "mint a new id for a new command.",
        command_id=pinned,
    )


def _probe(queries: Queries, rows: Sequence[StageRow], which: list[int]) -> Statement:
    picked = [rows[i] for i in which]
    return queries["stage_probe"], {
        "rks": sorted({r.rk for r in picked}),
        "intent_ids": sorted({_intent_id(r) for r in picked}),
        "command_ids": sorted({r.pinned for r in picked if r.pinned is not None}),
    }


def _insert(
    queries: Queries, rows: Sequence[StageRow], which: list[int], min_version: int
) -> Statement:
    picked = [rows[i] for i in which]
    return queries["stage_intents"], {
        "rks": [r.rk for r in picked],
        "tenants": [r.tenant for r in picked],
        "types": [r.type for r in picked],
        "ids": [r.id for r in picked],
        "commands": [r.command for r in picked],
        "payloads": [r.payload for r in picked],
        "versions": [r.version for r in picked],
        "callers": [r.caller for r in picked],
        "pinned": [r.pinned for r in picked],
        "uuids": [_uuid4() for _ in picked],
        "suffixes": [r.suffix for r in picked],
        "delays": [r.delay for r in picked],
        "ats": [r.at for r in picked],
        "slacks": [r.slack for r in picked],
        "min_version": min_version,
        "source_type": TRANSACTION_SOURCE,
    }


def _uuid4() -> str:
    return str(uuid.uuid4())


__all__ = ["Rows", "StageRow", "Statement", "plan"]
