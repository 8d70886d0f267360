r"""Storable JSON: the one encoding of everything akter writes to PostgreSQL.

State, events, outbox payloads, receipts and declared-error fields are all stored as ``jsonb``.
``storable_json`` turns a JSON-mode value into the canonical text that is stored, or refuses it
with :class:`Unstorable` naming the first path that PostgreSQL (or a later read) could not carry:

- text with NUL (``jsonb`` rejects ``\\u0000``) or a lone surrogate (not UTF-8);
- NaN and infinities (not JSON; never coerced to ``null``);
- integers past the interpreter's int/str conversion limit (a later read could not decode them);
- nesting deeper than :data:`MAX_DEPTH` containers (decoders recurse);
- anything that is not a JSON value (a ``set``, ``object()``, ``bytes``).

Floats keep their type through ``jsonb``: ``jsonb`` stores numbers as ``numeric`` and prints
``1e+16`` back as ``10000000000000000``, which every decoder reads as an integer. A float written
with a positive exponent is therefore written out in full with a ``.0`` (``numeric`` keeps the
scale), so what a later read decodes is the float that was written. :func:`stored_value` is that
read: the value a replay, a cold load or a consumer will see.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import ipaddress
import json
import math
import pathlib
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from decimal import Decimal
from json.encoder import (  # type: ignore[attr-defined]
    c_make_encoder,
    encode_basestring,
    encode_basestring_ascii,
)
from typing import Any, TypeVar, cast

from pydantic import BaseModel

# Leaf types pydantic's JSON mode serializes (anything else in an ``Any`` field fails).
_KNOWN = (
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
    Decimal,
    enum.Enum,
    pathlib.PurePath,
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    bytearray,
)

#: Deepest nesting of arrays and objects a stored value may have. pydantic's JSON parser stops
#: at about 200 levels and its serializer at 254; the stdlib codecs at about 990.
MAX_DEPTH = 200


class ReusedEncoder:
    """``json.JSONEncoder(**options).encode``, its C encoder built once per thread.

    ``JSONEncoder.encode`` builds the C encoder (and a closure) on every call: most of the cost
    of encoding a small value. The C encoder's only state is its circular-reference markers, so
    each thread keeps its own, and one that raised is built again (its markers may hold what the
    failed call left). The text and the errors are the stdlib's: the same C encoder runs.
    """

    def __init__(self, **options: Any) -> None:
        self._options = json.JSONEncoder(**options)
        self._local = threading.local()

    def _build(self) -> Callable[[Any, int], Any] | None:
        o = self._options
        if c_make_encoder is None:  # an interpreter without the C accelerator
            return None
        return cast(
            Callable[[Any, int], Any],
            c_make_encoder(
                {} if o.check_circular else None,
                o.default,
                encode_basestring_ascii if o.ensure_ascii else encode_basestring,
                o.indent,
                o.key_separator,
                o.item_separator,
                o.sort_keys,
                o.skipkeys,
                o.allow_nan,
            ),
        )

    def __call__(self, value: Any) -> str:
        local = self._local
        encode = getattr(local, "encode", None)
        if encode is None:
            encode = local.encode = self._build()
            if encode is None:
                return self._options.encode(value)
        try:
            return "".join(encode(value, 0))
        except BaseException:
            local.encode = None
            raise


#: The canonical encoder: sorted keys, compact separators, non-ASCII kept, no NaN. One instance
#: (``json.dumps`` with options builds an encoder per call); ``akter._ids.canonical_json`` too.
canonical_encode = ReusedEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)

#: Integers whose text :func:`storable_json` writes without the encoder (any bigint).
_INT_LOW, _INT_HIGH = -(2**63), 2**63 - 1
#: Types that can hold no float: :func:`check_finite` has nothing to look for in them.
_NO_FLOAT = frozenset({int, str, bool, type(None)})

# A JSON string literal (skipped) or a number with a positive exponent (rewritten).
_EXPONENT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+)?e\+\d+)')


class Unstorable(ValueError):
    """A value akter was about to store cannot be stored; ``path`` names where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason


def storable_json(value: Any, path: str = "value") -> str:
    """The canonical JSON text of a JSON-mode ``value``, safe to store as ``jsonb``.

    Keys are sorted, separators are compact, non-ASCII text is kept (as ``canonical_json``).

    Args:
        value: Dicts with string keys, lists, str, int, float, bool and ``None``.
        path: How the caller names ``value`` in errors (``"result"``, ``"state"``, ...).

    Returns:
        The text to store.

    Raises:
        Unstorable: naming the first path that cannot be stored, and why.
    """
    kind = type(value)
    if kind is int and _INT_LOW <= value <= _INT_HIGH:
        return int.__repr__(value)  # a small integer's text: the encoder's, without the encoder
    if kind is bool or value is None:
        return "true" if value is True else "false" if value is False else "null"
    try:
        text = canonical_encode(value)
    except (ValueError, TypeError, RecursionError):
        raise _problem(value, path) or Unstorable(path, "cannot be encoded as JSON") from None
    if "\\u0000" in text or (len(text) > MAX_DEPTH and _deep(text)):
        # Hints only (an escaped backslash before "u0000" looks alike, brackets may sit in
        # strings): walk the value to be sure.
        problem = _problem(value, path)
        if problem is not None:
            raise problem
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _problem(value, path) or Unstorable(path, "is not valid Unicode") from None
    if "e+" in text:  # float.__repr__ writes every positive exponent as "e+NN"
        text = _EXPONENT.sub(_full_float, text)
    return text


def stored_value(text: str) -> Any:
    """Decode stored JSON text the way a read from PostgreSQL will."""
    return json.loads(text)


def storable(value: Any, path: str = "value") -> Any:
    """``value`` as a later read of its stored JSON will see it (or :class:`Unstorable`)."""
    if (
        value is None
        or type(value) in (str, bool)
        or (type(value) is int and -(2**63) < value < 2**63)
    ):
        return storable_json(value, path) and value
    return stored_value(storable_json(value, path))


def check_finite(value: Any, path: str = "value") -> None:
    """Refuse NaN and infinities anywhere in a Python value, before pydantic sees it.

    pydantic's JSON mode turns a NaN or an infinity held by an ``Any`` field into ``null``, so
    :func:`storable_json` alone would store a changed value. This check runs on the value as the
    handler produced it (models, dataclasses and sets are looked into) at C speed.

    Raises:
        Unstorable: naming the first NaN or infinity.
    """
    if type(value) in _NO_FLOAT:
        return  # nothing to look into (the common reply: an int, a string, nothing)
    if type(value) is dict and all(
        type(k) is str and type(v) in _NO_FLOAT for k, v in value.items()
    ):
        return  # a flat object of such values (a small state's python dump)
    try:
        _finite(value)
    except ValueError as exc:
        problem = _nonfinite(value, path)
        if problem is not None:
            raise problem from None
        if "integer string conversion" in str(exc):
            return  # no float at all: an integer past the int/str limit, which the dump names
        raise Unstorable(path, "holds NaN or an infinity") from None
    except (TypeError, RecursionError):
        pass  # not a JSON shape at all: the JSON-mode dump that follows says where


def unserializable_path(value: Any, path: str = "value") -> str:
    """Where a value pydantic could not serialize holds something no encoder knows (best effort)."""
    inner = _inside(value)
    found = None if inner is None else _foreign(inner, path)
    return found or path


def _inside(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return dict(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    if isinstance(o, set | frozenset):
        return list(o)
    return None  # a datetime, a UUID, an enum...: holds no float


_finite = ReusedEncoder(allow_nan=False, skipkeys=True, check_circular=False, default=_inside)


def _nonfinite(value: Any, path: str) -> Unstorable | None:
    def check(item: Any, node: Node, depth: int, key: bool) -> Unstorable | None:
        if isinstance(item, float):
            if math.isnan(item):
                return Unstorable(dotted(node, path), "is NaN, which JSON cannot represent")
            if math.isinf(item):
                return Unstorable(dotted(node, path), "is an infinity, which JSON cannot represent")
        return None

    return first_problem(value, check, containers=_SEQUENCES, inside=_inside, descend=MAX_DEPTH)


def _foreign(value: Any, path: str) -> str | None:
    def check(item: Any, node: Node, depth: int, key: bool) -> str | None:
        if item is None or depth > MAX_DEPTH or isinstance(item, _NOT_FOREIGN):
            return None
        return dotted(node, path)

    return first_problem(value, check, containers=_SEQUENCES, inside=_inside, descend=MAX_DEPTH)


def _full_float(match: re.Match[str]) -> str:
    number = match.group(1)
    if number is None:
        return match.group(0)
    return format(Decimal(number), "f") + ".0"


def _deep(text: str) -> bool:
    return text.count("[") + text.count("{") > MAX_DEPTH


def _problem(value: Any, path: str) -> Unstorable | None:
    """The first unstorable path in ``value``, depth first, in key order."""

    def check(item: Any, node: Node, depth: int, key: bool) -> Unstorable | None:
        if key:
            if not isinstance(item, str):
                where = dotted(node, path)
                return Unstorable(where, f"has a key of type {type(item).__name__}, not str")
            why = text_problem(item)
            return None if why is None else Unstorable(f"{dotted(node, path)} key {item!r}", why)
        if depth > MAX_DEPTH:
            return Unstorable(dotted(node, path), f"nests deeper than {MAX_DEPTH} levels")
        why = _json_problem(item)
        return None if why is None else Unstorable(dotted(node, path), why)

    return first_problem(value, check, containers=(dict, list), sort_keys=True, keys=True)


def _json_problem(value: Any) -> str | None:
    """Why a value inside a JSON-mode document cannot be stored (containers: nothing yet)."""
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        return None
    if isinstance(value, int):
        if abs(value).bit_length() > _INT_BITS:
            return f"is an integer of more than {sys.get_int_max_str_digits()} digits"
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return "is NaN, which JSON cannot represent"
        if math.isinf(value):
            return "is an infinity, which JSON cannot represent"
        return None
    return f"is a {type(value).__name__}, which is not a JSON value"


def text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` (a NUL, a lone surrogate), if it cannot."""
    if "\x00" in text:
        return "contains a NUL character, which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


# --- the walker -----------------------------------------------------------------------------------

#: Where an item sits: ``(parent node, path segment)``, ``None`` at the root. Paths are built
#: from it only when a problem is found.
Node = tuple[Any, str] | None
T = TypeVar("T")
_SEQUENCES = (dict, list, tuple)
_SCALARS = (str, bytes, int, float)
_NOT_FOREIGN = _SCALARS + _SEQUENCES + _KNOWN


def dotted(node: Node, root: str) -> str:
    """The path of ``node`` below ``root``: ``root.seg.seg``."""
    parts: list[str] = []
    while node is not None:
        node, segment = node
        parts.append(segment)
    parts.append(root)
    return ".".join(reversed(parts))


def first_problem(
    value: Any,
    check: Callable[[Any, Node, int, bool], T | None],
    *,
    containers: tuple[type, ...],
    sort_keys: bool = False,
    keys: bool = False,
    inside: Callable[[Any], Any] | None = None,
    descend: int | None = None,
) -> T | None:
    """Walk ``value`` depth first in document order; the first thing ``check`` reports.

    The one walk behind every refusal of a value akter would store. It is iterative, so a
    deep value cannot exhaust the stack.

    Args:
        value: What to walk.
        check: Called as ``check(item, node, depth, is_key)`` for every item, before its
            children (the root is at depth 0, a dict's keys at the dict's own depth); a
            non-``None`` answer ends the walk and is returned.
        containers: The types whose items are walked (dicts by key, the rest in order).
        sort_keys: Walk dict keys in ``str`` order (as the stored JSON sorts them).
        keys: Pass dict keys to ``check`` too, each just before its value; keys are never
            descended.
        inside: Gives what to walk instead of an item (a model's fields), or ``None``.
        descend: The deepest level whose containers are descended (``None``: no limit).
    """
    stack: list[tuple[Any, Node, int, bool]] = [(value, None, 0, False)]
    while stack:
        item, node, depth, is_key = stack.pop()
        if inside is not None:
            inner = inside(item)
            if inner is not None:
                item = inner
        found = check(item, node, depth, is_key)
        if found is not None:
            return found
        if is_key or not isinstance(item, containers) or (descend is not None and depth > descend):
            continue
        children: list[tuple[Any, Node, int, bool]] = []
        if isinstance(item, dict):
            for k in sorted(item, key=str) if sort_keys else item:
                if keys:
                    children.append((k, node, depth, True))
                children.append((item[k], (node, str(k)), depth + 1, False))
        else:
            for i, v in enumerate(cast(Iterable[Any], item)):
                children.append((v, (node, str(i)), depth + 1, False))
        stack.extend(reversed(children))
    return None


# Digits of an int's decimal text grow as bits * log10(2); stay inside the conversion limit.
_INT_BITS = int((sys.get_int_max_str_digits() or 10**6) * 3.32) - 8
