"""Minted actor ids: UUIDv7 (semantics §1.1) and the child UUIDv8 of a turn (semantics §1.5).

Pure functions but for :func:`uuid7`, which reads the wall clock and the process's random
source; :mod:`akter._ids` re-exports them with the rest of identity and addressing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
import uuid

_UUID7_LOCK = threading.Lock()
_uuid7_last_ms = -1
_uuid7_last_rand = 0
_RAND_BITS = 74  # 12 bits of rand_a + 62 bits of rand_b
_UUID8_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_MINT_DOMAIN = "durable-actors/mint/v1"


def uuid7() -> str:
    """Return a new UUIDv7 (RFC 9562), lowercase hyphenated.

    The first 48 bits are the Unix time in milliseconds; the remaining 74 non-version,
    non-variant bits are random. Within one process the ids strictly increase: in the same
    millisecond (or if the clock steps back) the random part is advanced by a random step
    (RFC 9562 §6.2, method 2), spilling into the next millisecond if it overflows.

    Returns:
        A string such as ``"0192e4a1-7c3b-7d2e-9f10-3a4b5c6d7e8f"``.
    """
    global _uuid7_last_ms, _uuid7_last_rand
    now_ms = time.time_ns() // 1_000_000
    with _UUID7_LOCK:
        if now_ms > _uuid7_last_ms:
            ms, rand = now_ms, secrets.randbits(_RAND_BITS)
        else:
            ms, rand = _uuid7_last_ms, _uuid7_last_rand + 1 + secrets.randbits(32)
            if rand >> _RAND_BITS:
                ms, rand = ms + 1, secrets.randbits(_RAND_BITS)
        _uuid7_last_ms, _uuid7_last_rand = ms, rand
    rand_a = rand >> 62
    rand_b = rand & ((1 << 62) - 1)
    value = ((ms & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))


def is_uuid8(s: str) -> bool:
    """Return whether ``s`` is a lowercase hyphenated UUIDv8 with the RFC 9562 variant.

    Args:
        s: The candidate, typically an actor id.

    Returns:
        ``True`` for ids shaped like :func:`child_id` results.
    """
    return isinstance(s, str) and _UUID8_RE.fullmatch(s) is not None


def child_id(
    *,
    tenant: str,
    parent_type: str,
    parent_id: str,
    parent_command_id: str,
    ordinal: int,
    child_type: str,
) -> str:
    """Derive the id of a child minted in a parent's turn (semantics §1.5).

    The id depends only on its inputs, so a retried command mints the same children.

    Args:
        tenant: The parent's (and child's) tenant.
        parent_type: The parent's actor type.
        parent_id: The parent's id (``""`` for a singleton).
        parent_command_id: The command id of the minting turn.
        ordinal: How many ``mint``/``create`` calls this command made before, from 0.
        child_type: The child's actor type.

    Returns:
        A lowercase hyphenated UUIDv8 with the RFC 9562 variant.

    Raises:
        ValueError: If ``ordinal`` is negative or not an int.
    """
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
        raise ValueError(f"Mint ordinal {ordinal!r} must be a non-negative int.")
    fields = (
        _MINT_DOMAIN,
        tenant,
        parent_type,
        parent_id,
        parent_command_id,
        str(ordinal),
        child_type,
    )
    material = bytearray()
    for field in fields:
        encoded = field.encode("utf-8")
        material += len(encoded).to_bytes(4, "big")
        material += encoded
    raw = bytearray(hashlib.sha256(material).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
    raw[8] = (raw[8] & 0x3F) | 0x80  # variant 10xx
    return str(uuid.UUID(bytes=bytes(raw)))
