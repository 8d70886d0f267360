"""Identity and addressing: the published vectors and the validation rules of semantics §1."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akter._ids import (
    ACTOR_TYPE_RE,
    MEMBER_NAME_RE,
    CommandId,
    bucket,
    canonical_json,
    child_id,
    is_actor_type_name,
    is_member_name,
    is_uuid8,
    mint_command_id,
    mint_framework_id,
    ms_from_duration,
    parse_command_id,
    parse_framework_id,
    payload_hash,
    placement_key,
    routing_key,
    uuid7,
    validate_actor_id,
    validate_key,
    validate_subject,
    validate_tenant,
)
from akter.errors import ActorError
from akter.http.problems import status_of

WINDOW = 86_400_000

#: JSON values as handlers return them (no NaN or infinities: canonical JSON refuses those).
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
UUID4 = "0190a3b4-5c6d-4e7f-8a9b-0c1d2e3f4a5b"
PARENT_CID = f"v1.1767225600000.1767312000000.{UUID4}"

# --------------------------------------------------------------------------------------------
# Canonical JSON and payload hashes
# --------------------------------------------------------------------------------------------


def test_payload_hash_vector() -> None:
    assert (
        payload_hash({"cents": 1200})
        == "a38935fe39cd91a77caf5ea1957950f439246b5d23bc461b5e630268849fe2f1"
    )


def test_canonical_json_sorts_keys_at_every_level_and_keeps_unicode() -> None:
    value = {"b": {"z": 1, "a": [3, {"y": "é", "x": None}]}, "a": True}
    assert canonical_json(value) == '{"a":true,"b":{"a":[3,{"x":null,"y":"é"}],"z":1}}'


def test_payload_hash_ignores_key_order() -> None:
    first = {"a": 1, "b": {"c": [1, 2], "d": "x"}}
    second = {"b": {"d": "x", "c": [1, 2]}, "a": 1}
    assert payload_hash(first) == payload_hash(second)


def test_payload_hash_keeps_list_order() -> None:
    assert payload_hash({"items": [1, 2]}) != payload_hash({"items": [2, 1]})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_canonical_json_refuses_nan_and_infinity(bad: float) -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": [bad]})
    with pytest.raises(ValueError):
        payload_hash({"x": bad})


# --------------------------------------------------------------------------------------------
# Placement key, routing key, bucket (§1.2)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected_bytes", "expected_routing_key", "expected_bucket"),
    [
        (("tenant", "default", "", ""), '[1,"tenant","default"]', 3836416863133181127, 53),
        (("tenant", "acme", "Order", "o-1"), '[1,"tenant","acme"]', 2472398586103912953, 34),
        (
            ("actor", "acme", "Order", "o-1"),
            '[1,"actor","acme","Order","o-1"]',
            2271442690314994670,
            31,
        ),
        (
            ("actor", "default", "Café", "é"),
            '[1,"actor","default","Café","é"]',
            -6062870058202291897,
            -85,
        ),
    ],
)
def test_routing_vectors(
    key: tuple[str, str, str, str],
    expected_bytes: str,
    expected_routing_key: int,
    expected_bucket: int,
) -> None:
    placement, tenant, actor_type, actor_id = key
    assert placement in ("tenant", "actor")
    raw = placement_key(
        "tenant" if placement == "tenant" else "actor", tenant, actor_type, actor_id
    )
    assert raw == expected_bytes.encode("utf-8")
    rk = routing_key(raw)
    assert rk == expected_routing_key
    assert bucket(rk) == expected_bucket


def test_bucket_range() -> None:
    assert bucket(-(2**63)) == -128
    assert bucket(2**63 - 1) == 127
    assert bucket(-1) == -1
    assert bucket(0) == 0


# --------------------------------------------------------------------------------------------
# Command ids (§1.3, §1.4)
# --------------------------------------------------------------------------------------------


def _code_of(raw: object, window_ms: int = WINDOW) -> str | None:
    with pytest.raises(ActorError) as info:
        parse_command_id(raw, window_ms)
    error = info.value
    assert error.reason == "InvalidCommandId"
    assert error.retryable is False
    assert status_of(error) == 400
    assert error.command_id == (raw if isinstance(raw, str) else None)
    return error.code


def test_parse_command_id_accepts_a_valid_id() -> None:
    raw = f"v1.1000.{1000 + WINDOW}.{UUID4}"
    assert parse_command_id(raw, WINDOW) == CommandId(
        raw=raw, issued_ms=1000, expires_ms=1000 + WINDOW
    )


def test_parse_command_id_accepts_zero_issued() -> None:
    assert parse_command_id(f"v1.0.5.{UUID4}", 5) == CommandId(f"v1.0.5.{UUID4}", 0, 5)


@pytest.mark.parametrize("variant", ["8", "9", "a", "b"])
def test_parse_command_id_accepts_every_variant(variant: str) -> None:
    raw = f"v1.1.2.0190a3b4-5c6d-4e7f-{variant}a9b-0c1d2e3f4a5b"
    assert parse_command_id(raw, 1).issued_ms == 1


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "abc",
        "v1.x",
        "v.1.2." + UUID4,
        "1.1.2." + UUID4,
        f"v1.1.2.{UUID4.upper()}",
        "v1.1.2.0190a3b4-5c6d-5e7f-8a9b-0c1d2e3f4a5b",  # uuid version 5
        "v1.1.2.0190a3b4-5c6d-4e7f-ca9b-0c1d2e3f4a5b",  # variant c
        "v1.1.2.0190a3b45c6d4e7f8a9b0c1d2e3f4a5b",  # not hyphenated
        f"v1.01.2.{UUID4}",  # leading zero
        f"v1.1.02.{UUID4}",
        f"v1.00.1.{UUID4}",
        f"v1.1234567890123456.1234567890123457.{UUID4}",  # 16 digits
        f"v1.-1.0.{UUID4}",
        f"v1.1.2.{UUID4}\n",
        f"v1.1.2.{UUID4}.extra",
        f" v1.1.2.{UUID4}",
        f"v1.1.2.{UUID4[:-1]}",
    ],
)
def test_parse_command_id_malformed(raw: str) -> None:
    assert _code_of(raw, 1) == "malformed"


@pytest.mark.parametrize("raw", [None, 42, b"v1.1.2.x", ["v1"]])
def test_parse_command_id_non_str_is_malformed(raw: object) -> None:
    assert _code_of(raw) == "malformed"


@pytest.mark.parametrize("raw", [f"v2.1.2.{UUID4}", "v2.garbage", "v0.", "v10.1.2.x", "v01."])
def test_parse_command_id_version(raw: str) -> None:
    assert _code_of(raw, 1) == "version"


def test_parse_command_id_window_mismatch() -> None:
    raw = f"v1.1000.{1000 + WINDOW - 1}.{UUID4}"
    assert _code_of(raw) == "window"
    assert _code_of(f"v1.1000.2000.{UUID4}", 999) == "window"


def test_parse_command_id_checks_in_order() -> None:
    # The version check comes before the format check, the format check before the window.
    assert _code_of(f"v2.01.2.{UUID4.upper()}", 1) == "version"
    assert _code_of(f"v1.01.2.{UUID4}", 5) == "malformed"


def test_invalid_command_id_message_names_the_id() -> None:
    raw = f"v2.1.2.{UUID4}"
    with pytest.raises(ActorError) as info:
        parse_command_id(raw, 1)
    assert repr(raw) in str(info.value)


def test_invalid_command_id_message_is_bounded_for_huge_input() -> None:
    with pytest.raises(ActorError) as info:
        parse_command_id("x" * 100_000, WINDOW)
    assert len(str(info.value)) < 400
    assert info.value.code == "malformed"


def test_mint_parse_round_trip() -> None:
    now = 1_767_225_600_000
    raw = mint_command_id(now, WINDOW)
    parsed = parse_command_id(raw, WINDOW)
    assert parsed == CommandId(raw=raw, issued_ms=now, expires_ms=now + WINDOW)
    assert uuid.UUID(raw.rsplit(".", 1)[1]).version == 4
    assert mint_command_id(now, WINDOW) != raw


def test_minted_ids_end_in_the_text_of_a_random_uuid4() -> None:
    # The uuid is formatted from 16 random bytes without a UUID object: it must read back as
    # what str(uuid.uuid4()) gives: version 4, RFC 9562 variant, lowercase, hyphenated.
    minted = {mint_command_id(1_000, WINDOW).rsplit(".", 1)[1] for _ in range(2_000)}
    assert len(minted) == 2_000
    for text in minted:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text
    # Every other bit is random: each of the 122 is seen both ways.
    ones = [0] * 128
    for text in minted:
        value = uuid.UUID(text).int
        for bit in range(128):
            ones[bit] += value >> bit & 1
    fixed = {127 - 48 - i for i in range(4)} | {127 - 64, 127 - 65}  # version, variant
    assert all(0 < ones[bit] < 2_000 for bit in range(128) if bit not in fixed)


@given(_JSON)
def test_canonical_json_is_json_dumps_with_the_canonical_options(value: object) -> None:
    assert canonical_json(value) == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def test_mint_command_id_refuses_out_of_range_times() -> None:
    with pytest.raises(ValueError):
        mint_command_id(-1, WINDOW)
    with pytest.raises(ValueError):
        mint_command_id(10**15 - 1, 1)


def test_mint_framework_id_expiry() -> None:
    now = 1_000_000
    # A due time in the future extends the expiry past the due time.
    later = parse_framework_id(mint_framework_id(now, now + 5_000, 30_000, WINDOW))
    assert (later.issued_ms, later.expires_ms) == (now, now + 5_000 + 30_000 + WINDOW)
    # A due time in the past counts from now.
    late = parse_framework_id(mint_framework_id(now, now - 5_000, 0, WINDOW))
    assert (late.issued_ms, late.expires_ms) == (now, now + WINDOW)
    # Such ids are not valid caller ids with the same window when the span differs.
    with pytest.raises(ActorError) as info:
        parse_command_id(later.raw, WINDOW)
    assert info.value.code == "window"


def test_parse_framework_id_runs_checks_one_to_three() -> None:
    with pytest.raises(ActorError) as info:
        parse_framework_id(f"v2.1.2.{UUID4}")
    assert info.value.code == "version"
    with pytest.raises(ActorError) as info:
        parse_framework_id(f"v1.01.2.{UUID4}")
    assert info.value.code == "malformed"


# --------------------------------------------------------------------------------------------
# UUIDv7 and child UUIDv8 (§1.1, §1.5)
# --------------------------------------------------------------------------------------------


def test_uuid7_format_version_and_timestamp() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    parsed = uuid.UUID(value)
    assert str(parsed) == value
    assert value == value.lower()
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert before <= parsed.int >> 80 <= after + 1
    assert not is_uuid8(value)


def test_uuid7_strictly_increases_within_a_process() -> None:
    values = [uuid7() for _ in range(5_000)]
    assert len(set(values)) == len(values)
    assert values == sorted(values)
    assert [uuid.UUID(v).int for v in values] == sorted(uuid.UUID(v).int for v in values)


CHILD_VECTORS = [
    ("acme", "Planner", "p1", 0, "Task", "0c5a337c-0560-8eb1-b010-902d673172c7"),
    ("acme", "Planner", "p1", 1, "Task", "3ae6ebfe-9609-8687-b75b-9e198d77fb9f"),
    ("acme", "Planner", "p1", 0, "Note", "fe9dbb44-85a2-8877-acb9-6831a50179ef"),
    ("other", "Planner", "p1", 0, "Task", "aa018c3d-8a57-8020-928d-3dcdf7f18354"),
    ("acme", "Planner", "p2", 0, "Task", "6aed5848-79c2-8c75-87c9-9a1c1f0b362c"),
    ("acme", "Café", "", 0, "Task", "d30d3458-a1b1-89ad-af2e-945f0d48a9f1"),
]


@pytest.mark.parametrize(
    ("tenant", "parent_type", "parent_id", "ordinal", "child_type", "expected"), CHILD_VECTORS
)
def test_child_id_vectors(
    tenant: str, parent_type: str, parent_id: str, ordinal: int, child_type: str, expected: str
) -> None:
    minted = child_id(
        tenant=tenant,
        parent_type=parent_type,
        parent_id=parent_id,
        parent_command_id=PARENT_CID,
        ordinal=ordinal,
        child_type=child_type,
    )
    assert minted == expected
    assert is_uuid8(minted)
    assert uuid.UUID(minted).version == 8
    assert uuid.UUID(minted).variant == uuid.RFC_4122


def test_child_id_depends_on_the_parent_command_id() -> None:
    other = child_id(
        tenant="acme",
        parent_type="Planner",
        parent_id="p1",
        parent_command_id=mint_command_id(1, WINDOW),
        ordinal=0,
        child_type="Task",
    )
    assert other != CHILD_VECTORS[0][-1]
    assert is_uuid8(other)


@pytest.mark.parametrize("ordinal", [-1, True])
def test_child_id_refuses_bad_ordinals(ordinal: int) -> None:
    with pytest.raises(ValueError):
        child_id(
            tenant="acme",
            parent_type="Planner",
            parent_id="p1",
            parent_command_id=PARENT_CID,
            ordinal=ordinal,
            child_type="Task",
        )


@pytest.mark.parametrize(
    "value",
    [
        "0C5A337C-0560-8EB1-B010-902D673172C7",  # uppercase
        "0c5a337c-0560-4eb1-b010-902d673172c7",  # version 4
        "0c5a337c-0560-8eb1-c010-902d673172c7",  # variant c
        "0c5a337c05608eb1b010902d673172c7",  # not hyphenated
        "",
        "p1",
    ],
)
def test_is_uuid8_rejects(value: str) -> None:
    assert not is_uuid8(value)


# --------------------------------------------------------------------------------------------
# Names and validation (§1.1, §1.6)
# --------------------------------------------------------------------------------------------


def _invalid_input_field(exc: ActorError) -> str | None:
    assert exc.reason == "InvalidInput"
    assert exc.retryable is False
    return exc.field


@pytest.mark.parametrize("tenant", ["default", "a", "Acme.eu-1:team_2", "x" * 128])
def test_validate_tenant_accepts(tenant: str) -> None:
    assert validate_tenant(tenant) == tenant


@pytest.mark.parametrize("tenant", ["", "x" * 129, "a/b", "a b", "café", "a\n", None, 7])
def test_validate_tenant_rejects(tenant: object) -> None:
    with pytest.raises(ActorError) as info:
        validate_tenant(tenant)
    assert _invalid_input_field(info.value) == "tenant"
    assert repr(tenant)[:20] in str(info.value)


@pytest.mark.parametrize("actor_id", ["o-1", "x" * 256, "é" * 128, "a b/c", "🙂"])
def test_validate_actor_id_accepts(actor_id: str) -> None:
    assert validate_actor_id(actor_id) == actor_id


@pytest.mark.parametrize(
    "actor_id", ["", "x" * 257, "é" * 128 + "x", "a\x00b", "a\nb", "tab\t", "del\x7f", "\ud800", 1]
)
def test_validate_actor_id_rejects(actor_id: object) -> None:
    with pytest.raises(ActorError) as info:
        validate_actor_id(actor_id)
    assert _invalid_input_field(info.value) == "id"


@pytest.mark.parametrize("subject", ["", "alice", "x" * 512, "é" * 256])
def test_validate_subject_accepts(subject: str) -> None:
    assert validate_subject(subject) == subject


@pytest.mark.parametrize("subject", ["x" * 513, "é" * 256 + "x", None])
def test_validate_subject_rejects(subject: object) -> None:
    with pytest.raises(ActorError) as info:
        validate_subject(subject)
    assert _invalid_input_field(info.value) == "subject"


@pytest.mark.parametrize("key", ["a", "x" * 200, "reminder:1", "a$"])
def test_validate_key_accepts(key: str) -> None:
    assert validate_key(key, "timer key") == key


@pytest.mark.parametrize("key", ["", "$x", "$job:x", "x" * 201, None, 5])
def test_validate_key_rejects(key: object) -> None:
    with pytest.raises(ValueError, match="timer key") as info:
        validate_key(key, "timer key")
    assert not isinstance(info.value, ActorError)


@pytest.mark.parametrize("name", ["Order", "a", "Order_2", "A" * 64])
def test_actor_type_names_accepted(name: str) -> None:
    assert ACTOR_TYPE_RE.match(name) is not None
    assert is_actor_type_name(name)


@pytest.mark.parametrize("name", ["", "_Order", "2Order", "Or-der", "Café", "A" * 65, "A\n", 1])
def test_actor_type_names_rejected(name: object) -> None:
    assert not is_actor_type_name(name)


@pytest.mark.parametrize("name", ["place", "Place2", "add_item", "café"])
def test_member_names_accepted(name: str) -> None:
    assert MEMBER_NAME_RE.match(name) is not None
    assert is_member_name(name)


@pytest.mark.parametrize("name", ["", "_private", "$maintenance", "2x", "a-b", "a b", "a\n", None])
def test_member_names_rejected(name: object) -> None:
    assert not is_member_name(name)


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("duration", "expected"),
    [
        (0, 0),
        (0.0, 0),
        (-0.0, 0),
        (1, 1000),
        (0.001, 1),
        (0.0011, 2),
        (0.3, 300),
        (1.5, 1500),
        (0.0000001, 1),
        (timedelta(0), 0),
        (timedelta(milliseconds=1.5), 2),
        (timedelta(microseconds=1), 1),
        (timedelta(seconds=2), 2000),
        (timedelta(days=1), 86_400_000),
    ],
)
def test_ms_from_duration(duration: float | timedelta, expected: int) -> None:
    result = ms_from_duration(duration, "delay")
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "duration",
    [-1, -0.001, float("nan"), float("inf"), True, False, timedelta(milliseconds=-1), "1", None],
)
def test_ms_from_duration_rejects(duration: object) -> None:
    with pytest.raises(ValueError, match="delay"):
        ms_from_duration(duration, "delay")  # type: ignore[arg-type]
