"""Reads of a command's outcome by its id (``runtime.outcome``, issue 41).

Two probes on the framework pool: ``staged_outcome`` on a known actor (its receipt by the
receipts' key, whether its intent is still pending), and ``staged_locate`` for an id alone (a
pending intent by the outbox's id index, else the receipt of a transaction caller by migration
0015's partial index). Each returns the framework clock it read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store


@dataclass(frozen=True, slots=True)
class Found:
    """What one probe found of a command id.

    Attributes:
        where: ``(tenant, actor type, actor id)`` of the command's actor, when known.
        command: The command's name (from its receipt or its intent), when known.
        outcome: The receipt's decoded outcome (``{"ok": …}`` or ``{"error": …}``), or ``None``.
        pending: Whether its intent is still on the outbox (not yet delivered and settled).
        now: The framework clock the probe read.
    """

    where: tuple[str, str, str] | None
    command: str | None
    outcome: dict[str, Any] | None
    pending: bool
    now: int


class OutcomesGateway:
    """The probes of :mod:`akter._engine.outcomes`."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def probe(self, rk: int, where: tuple[str, str, str], command_id: str) -> Found:
        """The receipt of ``command_id`` on the actor ``where`` (routing key ``rk``)."""
        tenant, actor_type, actor_id = where
        params = {
            "rk": rk,
            "tenant": tenant,
            "type": actor_type,
            "id": actor_id,
            "command_id": command_id,
            "off": self._clock.offset_ms,
        }
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["staged_outcome"], params)
            row = await cur.fetchone()
        assert row is not None
        return Found(where, row["command"], _decoded(row["outcome"]), row["pending"], row["now"])

    async def locate(self, command_id: str) -> Found:
        """Where ``command_id`` went, without its actor (``where=None``: nothing holds it)."""
        params = {"command_id": command_id, "off": self._clock.offset_ms}
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["staged_locate"], params)
            row = await cur.fetchone()
            if row is None:
                plain = await conn.execute(self._store.queries["clock_now"], {"off": params["off"]})
                clock = await plain.fetchone()
                assert clock is not None
                return Found(None, None, None, False, int(clock[0]))  # type: ignore[call-overload]
        where = (str(row["tenant_id"]), str(row["actor_type"]), str(row["actor_id"]))
        return Found(where, row["command"], _decoded(row["outcome"]), row["pending"], row["now"])


def _decoded(outcome: Any) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return json.loads(outcome) if isinstance(outcome, str) else dict(outcome)
