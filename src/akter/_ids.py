"""Identity and addressing: canonical JSON, routing keys, command ids, minted ids, validation.

The minted ids (UUIDv7, a child's UUIDv8) live in :mod:`akter._minted_ids`, re-exported here.

Everything here is a pure function of its arguments (``uuid7`` and the minting functions also read
the wall clock or the process's random source), so the rules of semantics §1.1-§1.6 can be tested
without a database. The published vectors of the spec are pinned in ``tests/unit/test_ids.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Literal

import xxhash

from akter._json import canonical_encode
from akter._minted_ids import child_id, is_uuid8, uuid7
from akter.errors import ActorError, invalid_input

# --------------------------------------------------------------------------------------------
# Canonical JSON and payload hashes (semantics §2.1.2)
# --------------------------------------------------------------------------------------------


def canonical_json(value: object) -> str:
    """Serialize ``value`` as canonical JSON.

    Keys are sorted at every level, separators are ``,`` and ``:`` with no spaces, non-ASCII
    characters are kept as they are (no ASCII escapes) and array order is preserved.

    Args:
        value: A JSON-compatible value (dicts, lists, str, int, float, bool, ``None``).

    Returns:
        The canonical JSON text.

    Raises:
        ValueError: If ``value`` contains NaN or an infinity.
        TypeError: If ``value`` contains something JSON cannot represent.
    """
    return canonical_encode(value)


def payload_hash(payload: object) -> str:
    """Return the hex SHA-256 of the canonical JSON of ``payload`` encoded as UTF-8.

    Args:
        payload: The validated command arguments as ``{parameter: value}``.

    Returns:
        64 lowercase hex characters.

    Raises:
        ValueError: If the payload contains NaN or an infinity, or a lone surrogate.
        TypeError: If the payload contains something JSON cannot represent.
    """
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# Placement key, routing key, bucket (semantics §1.2)
# --------------------------------------------------------------------------------------------

Placement = Literal["tenant", "actor"]


def placement_key(placement: Placement, tenant: str, actor_type: str, actor_id: str) -> bytes:
    """Return the version-1 placement key of an actor as UTF-8 bytes.

    Args:
        placement: The type's placement: ``"tenant"`` keys by tenant alone, ``"actor"`` by the
            full actor identity.
        tenant: The actor's tenant.
        actor_type: The actor's type name (ignored for ``"tenant"`` placement).
        actor_id: The actor's id (ignored for ``"tenant"`` placement).

    Returns:
        ``[1,"tenant",tenant]`` or ``[1,"actor",tenant,type,id]`` as compact JSON in UTF-8.

    Raises:
        ValueError: If ``placement`` is neither ``"tenant"`` nor ``"actor"``.
    """
    key: list[object]
    if placement == "tenant":
        key = [1, "tenant", tenant]
    elif placement == "actor":
        key = [1, "actor", tenant, actor_type, actor_id]
    else:
        raise ValueError(f"Placement {placement!r} is unknown; use 'tenant' or 'actor'.")
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def routing_key(key_bytes: bytes) -> int:
    """Return the routing key of a placement key: XXH3-64 (seed 0) read as a signed int64.

    Args:
        key_bytes: A placement key from :func:`placement_key`.

    Returns:
        An integer in ``-2**63 ... 2**63 - 1``.
    """
    digest: int = xxhash.xxh3_64_intdigest(key_bytes, seed=0)
    # PostgreSQL has no unsigned bigint: store the same 64 bits as a signed value.
    return digest - (1 << 64) if digest >= (1 << 63) else digest


def bucket(routing_key: int) -> int:
    """Return the relay bucket of a routing key: its top byte, signed (``-128 ... 127``).

    Args:
        routing_key: A signed int64 from :func:`routing_key`.

    Returns:
        ``routing_key >> 56`` (arithmetic shift, as PostgreSQL computes it for ``bigint``).
    """
    return routing_key >> 56


# --------------------------------------------------------------------------------------------
# Command ids (semantics §1.3, §1.4)
# --------------------------------------------------------------------------------------------

_MS = r"(0|[1-9][0-9]{0,14})"
_UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_PREFIX_RE = re.compile(r"v([0-9]+)\.")
_V1_RE = re.compile(rf"v1\.{_MS}\.{_MS}\.{_UUID4}")
_MAX_MS = 10**15 - 1
_COMMAND_ID_FORMAT = "'v1.<issued_ms>.<expires_ms>.<uuid4>'"
#: How far ahead of the database clock a command id may be for a handle to wait for it
#: (``InvalidCommandId/future``). Ids minted from a clock estimate, here or by another process
#: sampling the server, are at most a round trip or an NTP slew ahead: a handle waits and
#: retries them within its delivery timeout. An id further ahead was minted on a clock that is
#: wrong (or the database clock moved back): the handle raises the refusal at once, with
#: ``retry_after``, rather than waiting or reporting a ``Timeout``.
FUTURE_WAIT_MS = 1_000
#: The response header of a command's answer holding the server's database-clock reading (epoch
#: ms, a lower bound of the framework clock when it answered): clients mint ids from it.
CLOCK_HEADER = "Akter-Clock"
#: The response header beside :data:`CLOCK_HEADER` holding the deployment's retry window (ms).
WINDOW_HEADER = "Akter-Retry-Window"


@dataclass(frozen=True, slots=True)
class CommandId:
    """A parsed, well-formed version-1 command id.

    Attributes:
        raw: The id exactly as given.
        issued_ms: When the id was minted, in framework-clock epoch milliseconds.
        expires_ms: When first executions of the id stop being admitted.
    """

    raw: str
    issued_ms: int
    expires_ms: int


def _show(value: object, limit: int = 80) -> str:
    """Return ``repr(value)`` cut to ``limit`` characters so a huge input cannot flood a log."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _invalid_command_id(raw: object, code: str, message: str) -> ActorError:
    return ActorError(
        "InvalidCommandId",
        message,
        code=code,
        retryable=False,
        command_id=raw if isinstance(raw, str) else None,
    )


def _parse_well_formed(raw: object) -> CommandId:
    """Run checks 1-3 of semantics §1.3 (prefix, version, format)."""
    if not isinstance(raw, str):
        raise _invalid_command_id(
            raw,
            "malformed",
            f"Command id {_show(raw)} is malformed: it must be a str of the form "
            f"{_COMMAND_ID_FORMAT}; mint one with a handle or POST /command-ids.",
        )
    prefix = _PREFIX_RE.match(raw)
    if prefix is None:
        raise _invalid_command_id(
            raw,
            "malformed",
            f"Command id {_show(raw)} is malformed: it must begin with 'v<version>.' as in "
            f"{_COMMAND_ID_FORMAT}; mint one with a handle or POST /command-ids.",
        )
    # Compared as text: 'v01.' is not version 1.
    if prefix.group(1) != "1":
        raise _invalid_command_id(
            raw,
            "version",
            f"Command id {_show(raw)} has version {_show(prefix.group(1))} but only version 1 "
            "is supported; mint a new id with this version of akter.",
        )
    match = _V1_RE.fullmatch(raw)
    if match is None:
        raise _invalid_command_id(
            raw,
            "malformed",
            f"Command id {_show(raw)} is malformed: expected {_COMMAND_ID_FORMAT} with "
            "millisecond parts of 1-15 digits without a leading zero and a lowercase "
            "hyphenated UUIDv4; mint one with a handle or POST /command-ids.",
        )
    return CommandId(raw=raw, issued_ms=int(match.group(1)), expires_ms=int(match.group(2)))


def parse_command_id(raw: object, window_ms: int) -> CommandId:
    """Parse and check a command id given by a caller (checks 1-4 of semantics §1.3).

    Check 5 (``issued > now``) needs the turn's clock and is done at admission.

    Args:
        raw: The command id; anything that is not a ``str`` is refused as malformed.
        window_ms: The deployment's retry window in milliseconds.

    Returns:
        The parsed id.

    Raises:
        ActorError: ``InvalidCommandId`` with code ``malformed``, ``version`` or ``window``
            (never retryable); the first failing check wins.
    """
    parsed = _parse_well_formed(raw)
    span = parsed.expires_ms - parsed.issued_ms
    if span != window_ms:
        raise _invalid_command_id(
            raw,
            "window",
            f"Command id {_show(raw)} spans {span} ms but this deployment's retry window is "
            f"{window_ms} ms; mint a new id against this deployment.",
        )
    return parsed


def parse_framework_id(raw: object) -> CommandId:
    """Parse a framework-minted id (semantics §1.4): checks 1-3 of §1.3, no window check.

    Framework ids expire at ``max(due, now) + slack + window``, so their span is not the window.

    Args:
        raw: The id stored on an outbox row.

    Returns:
        The parsed id.

    Raises:
        ActorError: ``InvalidCommandId`` with code ``malformed`` or ``version``.
    """
    return _parse_well_formed(raw)


def _format_id(issued_ms: int, expires_ms: int) -> str:
    for name, value in (("issued", issued_ms), ("expires", expires_ms)):
        if isinstance(value, bool) or not 0 <= value <= _MAX_MS:
            raise ValueError(
                f"Cannot mint a command id: {name} time {value!r} ms is outside 0..{_MAX_MS}."
            )
    return f"v1.{issued_ms}.{expires_ms}.{_uuid4_text()}"


def _uuid4_text() -> str:
    """``str(uuid.uuid4())`` from the same 16 random bytes, without building a ``UUID``.

    The version nibble is 4 and the variant bits are RFC 9562's ``10``, as ``uuid4`` sets them.
    """
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def mint_command_id(now_ms: int, window_ms: int) -> str:
    """Mint a caller command id ``v1.<now>.<now + window>.<uuid4>``.

    Args:
        now_ms: The framework clock's now, in epoch milliseconds.
        window_ms: The deployment's retry window in milliseconds.

    Returns:
        A new id that passes :func:`parse_command_id` with the same window.

    Raises:
        ValueError: If a millisecond part would be negative or longer than 15 digits.
    """
    return _format_id(now_ms, now_ms + window_ms)


def mint_parsed_command_id(now_ms: int, window_ms: int) -> CommandId:
    """:func:`mint_command_id`, already parsed (what :func:`parse_command_id` would return)."""
    expires_ms = now_ms + window_ms
    return CommandId(_format_id(now_ms, expires_ms), now_ms, expires_ms)


def mint_framework_id(now_ms: int, due_ms: int, slack_ms: int, window_ms: int) -> str:
    """Mint an id for an intent, timer, tick or job row (semantics §1.4).

    Args:
        now_ms: The framework clock's now, in epoch milliseconds.
        due_ms: When the row becomes due (``now_ms`` for an immediate intent).
        slack_ms: The sender's ``execution_timeout`` for relative delays, else 0.
        window_ms: The deployment's retry window in milliseconds.

    Returns:
        ``v1.<now>.<max(due, now) + slack + window>.<uuid4>``.

    Raises:
        ValueError: If a millisecond part would be negative or longer than 15 digits.
    """
    return _format_id(now_ms, max(due_ms, now_ms) + slack_ms + window_ms)


# --------------------------------------------------------------------------------------------
# Names and validation (semantics §1.1, §1.6)
# --------------------------------------------------------------------------------------------

#: Actor type names: 1-64 characters, an ASCII letter then ASCII letters, digits or ``_``.
ACTOR_TYPE_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_]{0,63}\Z")
#: Command, query and job names: an identifier that starts with a letter (so never ``_``/``$``).
MEMBER_NAME_RE = re.compile(r"\A[^\W\d_]\w*\Z")
_TENANT_RE = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def is_actor_type_name(name: object) -> bool:
    """Return whether ``name`` is a valid actor type name (semantics §1.1)."""
    return isinstance(name, str) and ACTOR_TYPE_RE.match(name) is not None


def is_member_name(name: object) -> bool:
    """Return whether ``name`` is a valid command, query or job name (semantics §1.1)."""
    return isinstance(name, str) and MEMBER_NAME_RE.match(name) is not None


def _utf8_length(value: str) -> int | None:
    """Return the UTF-8 length of ``value``, or ``None`` if it holds a lone surrogate."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def validate_tenant(t: object) -> str:
    """Check a tenant name: 1-128 bytes of ``[A-Za-z0-9._:-]``.

    Args:
        t: The candidate tenant.

    Returns:
        ``t`` unchanged.

    Raises:
        ActorError: ``InvalidInput`` (field ``tenant``) if the tenant is not valid.
    """
    if not isinstance(t, str) or _TENANT_RE.match(t) is None:
        raise invalid_input(
            f"Tenant {_show(t)} is invalid: use 1-128 characters of A-Z, a-z, 0-9, '.', '_', "
            "':' or '-'.",
            field="tenant",
        )
    return t


def _utf8_text(value: object, what: str, field: str, span: str, low: int, high: int) -> str:
    """``value`` if it is a str of ``low``..``high`` UTF-8 bytes; else ``InvalidInput``."""
    if not isinstance(value, str):
        raise invalid_input(f"{what} {_show(value)} is invalid: it must be a str.", field=field)
    size = _utf8_length(value)
    if size is None or not low <= size <= high:
        raise invalid_input(
            f"{what} {_show(value)} is invalid: it must be {span} of valid UTF-8.", field=field
        )
    return value


def validate_actor_id(i: object) -> str:
    """Check a named actor id: 1-256 UTF-8 bytes without control characters.

    Args:
        i: The candidate id.

    Returns:
        ``i`` unchanged.

    Raises:
        ActorError: ``InvalidInput`` (field ``id``) if the id is not valid.
    """
    text = _utf8_text(i, "Actor id", "id", "1-256 bytes", 1, 256)
    if _CONTROL_RE.search(text) is not None:
        raise invalid_input(
            f"Actor id {_show(i)} is invalid: it must not contain control characters "
            "(U+0000-U+001F, U+007F).",
            field="id",
        )
    return text


def validate_subject(s: object) -> str:
    """Check a user subject: a str of at most 512 UTF-8 bytes.

    Args:
        s: The candidate subject.

    Returns:
        ``s`` unchanged.

    Raises:
        ActorError: ``InvalidInput`` (field ``subject``) if the subject is not valid.
    """
    return _utf8_text(s, "Subject", "subject", "at most 512 bytes", 0, 512)


def validate_key(key: object, what: str) -> str:
    """Check a timer or job key: 1-200 characters, not starting with ``$`` (reserved).

    Args:
        key: The candidate key.
        what: What the key names, for the message (``"timer key"``, ``"job key"``).

    Returns:
        ``key`` unchanged.

    Raises:
        ValueError: If the key is not valid.
    """
    if not isinstance(key, str) or not 1 <= len(key) <= 200:
        raise ValueError(f"The {what} {_show(key)} is invalid: use a str of 1-200 characters.")
    if key.startswith("$"):
        raise ValueError(
            f"The {what} {_show(key)} is invalid: keys starting with '$' are reserved for "
            "akter; choose another key."
        )
    return key


def ms_from_duration(d: float | int | timedelta, what: str) -> int:
    """Convert a duration to whole milliseconds, rounding up.

    Numbers are seconds and are rounded using their shortest decimal form (``0.001`` is exactly
    1 ms, not the binary float slightly above it); ``timedelta`` values use their exact
    microseconds.

    Args:
        d: Seconds as an ``int`` or ``float``, or a ``timedelta``.
        what: What the duration is, for the message (``"delay"``, ``"timeout"``).

    Returns:
        The duration in whole milliseconds, ``>= 0``.

    Raises:
        ValueError: If ``d`` is negative, NaN, infinite, a ``bool`` or not a duration.
    """
    if isinstance(d, timedelta):
        micros = d // timedelta(microseconds=1)
        if micros < 0:
            raise ValueError(f"The {what} {d!r} must not be negative.")
        return -(-micros // 1000)
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        raise ValueError(
            f"The {what} {_show(d)} must be a number of seconds (int or float) or a timedelta."
        )
    if isinstance(d, float) and not math.isfinite(d):
        raise ValueError(f"The {what} {d!r} must be a finite number of seconds.")
    if d < 0:
        raise ValueError(f"The {what} {d!r} must not be negative.")
    if isinstance(d, int):
        return int(d) * 1000
    # float.__repr__ is the shortest round-tripping decimal, also for float subclasses.
    return math.ceil(Decimal(float.__repr__(d)) * 1000)


__all__ = [
    "ACTOR_TYPE_RE",
    "CLOCK_HEADER",
    "MEMBER_NAME_RE",
    "WINDOW_HEADER",
    "CommandId",
    "Placement",
    "bucket",
    "canonical_json",
    "child_id",
    "is_actor_type_name",
    "is_member_name",
    "is_uuid8",
    "mint_command_id",
    "mint_framework_id",
    "ms_from_duration",
    "parse_command_id",
    "parse_framework_id",
    "payload_hash",
    "placement_key",
    "routing_key",
    "uuid7",
    "validate_actor_id",
    "validate_key",
    "validate_subject",
    "validate_tenant",
]
