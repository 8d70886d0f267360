"""What akter agrees to store of a payload: the checks every argument and job payload pass.

:func:`storable_payload` is the one check that a validated model of arguments (or a job payload,
a workflow's arguments, a signal) can be stored as it is; :func:`unstorable_text` and
:func:`unstorable_argument` name the first value PostgreSQL or JSON would refuse or alter.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from akter._json import Node, dotted, first_problem, text_problem
from akter.errors import invalid_input

#: How deeply an argument may nest arrays and objects: an argument that is a list of dicts
#: nests 2 levels. pydantic's JSON serializer gives up near 255 levels and ``json`` near the
#: interpreter's recursion limit; 64 leaves room for the state, receipt and event documents an
#: argument is stored inside, and for the JSON parsers of other languages.
MAX_ARGUMENT_DEPTH = 64
#: Integers in arguments must fit a signed 64-bit integer: PostgreSQL's ``bigint`` and the
#: integers of the JSON decoders of other languages. (``jsonb`` itself stores any size, but
#: Python refuses to write an int of more than 4,300 digits as text.)
ARGUMENT_INT_RANGE = (-(2**63), 2**63 - 1)


def unstorable_text(value: Any, where: str = "") -> tuple[str, str] | None:
    """The first string PostgreSQL cannot store (NUL, lone surrogate), as (path, reason)."""
    return _first_problem(value, where, arguments=False)[0]


def unstorable_argument(payload: dict[str, Any]) -> tuple[str, str] | None:
    """The first part of a payload akter refuses to store, as (path, reason).

    Beyond :func:`unstorable_text`: NaN and infinities (JSON has no such numbers; ``Any``
    would store them as ``null``), integers outside :data:`ARGUMENT_INT_RANGE`, ``bytes`` that
    are not UTF-8 (they are stored as JSON text) and arguments nesting deeper than
    :data:`MAX_ARGUMENT_DEPTH` (reported at the argument itself). ``payload`` is the
    python-mode dump of the arguments by name; the walk is iterative, so a deep value cannot
    exhaust the stack.
    """
    return _first_problem(payload, "", arguments=True)[0]


_CONTAINERS = (dict, list, tuple, set, frozenset)
_PLAIN = frozenset({str, int, float, bool, type(None), bytes, bytearray})
_Problem = tuple[str, str]


def _path(node: Node, where: str) -> str:
    return (dotted(node, where) if where else dotted(node, "")[1:]) or "value"


def _plain_flat(value: Any) -> bool:
    """Whether ``value`` is a dict of plain, storable scalars under text keys (the usual payload).

    Such a payload has nothing to refuse and nothing foreign: one loop, no walk. Anything else,
    or anything this cannot vouch for, is left to the walk, which finds and names the problem.
    """
    if type(value) is not dict:
        return False
    low, high = ARGUMENT_INT_RANGE
    for key, item in value.items():
        if type(key) is not str or text_problem(key) is not None:
            return False
        kind = type(item)
        if kind is str:
            if text_problem(item) is not None:
                return False
        elif kind is int:
            if not low <= item <= high:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif item is not None and kind is not bool:
            return False
    return True


def _first_problem(value: Any, where: str, *, arguments: bool) -> tuple[_Problem | None, bool]:
    """The first problem in document order, and whether a leaf other than plain JSON was seen.

    Such a leaf (an enum, a datetime ...) becomes text only in the JSON dump, whose text the
    caller then checks too.
    """
    if _plain_flat(value):
        return None, False
    low, high = ARGUMENT_INT_RANGE
    foreign = False

    def check(item: Any, node: Node, depth: int, key: bool) -> _Problem | None:
        nonlocal foreign
        kind = type(item)
        if kind is str or isinstance(item, str):
            why = text_problem(item)
            return None if why is None else (_path(node, where), why)
        if not isinstance(item, _CONTAINERS):
            if not arguments:
                return None
            foreign = foreign or kind not in _PLAIN
            if isinstance(item, bytes | bytearray):
                try:
                    why = text_problem(bytes(item).decode("utf-8"))
                except UnicodeDecodeError:
                    why = "holds bytes that are not UTF-8 (bytes are stored as text)"
            elif kind is bool or isinstance(item, bool):
                why = None
            elif isinstance(item, int) and not low <= item <= high:
                why = f"is an integer outside the signed 64-bit range {low}..{high}"
            elif isinstance(item, float) and not math.isfinite(item):
                why = f"is {item!r}: NaN and infinities are refused (JSON has none)"
            else:
                why = None
            return None if why is None else (_path(node, where), why)
        if key:
            return None  # a tuple used as a dict key: the JSON dump refuses it, naming the field
        # The payload object is level 0, so an argument that is a list is level 1.
        if arguments and depth > MAX_ARGUMENT_DEPTH:
            why = f"nests deeper than {MAX_ARGUMENT_DEPTH} levels of arrays and objects"
            return _path(node, where).split(".", 1)[0], why
        return None

    return first_problem(value, check, containers=_CONTAINERS, keys=True), foreign


def storable_payload(model: BaseModel, what: str) -> dict[str, Any]:
    """The JSON form of a validated model of arguments (or a job payload), as akter stores it.

    Args:
        model: The validated arguments.
        what: What the model holds, for the message (``"arguments for Order.pay"``).

    Returns:
        ``model.model_dump(mode="json")``.

    Raises:
        ActorError: ``InvalidInput`` naming the field when a value cannot be stored faithfully
            (:func:`unstorable_argument`) or cannot be written as JSON at all.
    """
    # The python-mode dump still holds NaN, big ints and raw bytes, which the JSON dump would
    # turn into null, fail on or decode; it costs no recursion for deep values.
    problem, foreign = _first_problem(model.model_dump(mode="python"), "", arguments=True)
    if problem is None:
        try:
            payload = model.model_dump(mode="json")
        except (ValueError, TypeError) as exc:
            raise invalid_input(
                f"Invalid {what}: field {_failing_field(model)!r} cannot be written as JSON "
                f"({exc}).",
                field=_failing_field(model),
            ) from None
        # Text made by the JSON dump itself (an enum's value, a custom serializer).
        problem = unstorable_text(payload) if foreign else None
        if problem is None:
            return payload
    where, why = problem
    raise invalid_input(f"Invalid {what}: field {where!r} {why}.", field=where)


def _failing_field(model: BaseModel) -> str | None:
    for name in type(model).model_fields:
        try:
            model.model_dump(mode="json", include={name})
        except (ValueError, TypeError):
            return name
    return None
