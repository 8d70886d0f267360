"""``GET /tables/{table}``: one tenant's rows of an owned table, read-only (owned-tables guide).

The tenant is the caller's, from the auth provider, never a parameter. The owner type's access
policy decides with the kind ``rows``: ``ref`` is the owner type with id ``""`` in the caller's
tenant, ``member`` the table's name. Query parameters: ``<column>=<value>`` (equality on a
declared column, each at most once), ``after`` (the ``next`` cursor of the previous page) and
``limit`` (1 to :data:`MAX_LIMIT`, default :data:`DEFAULT_LIMIT`). Rows come in primary key
order, one page at a time (keyset pagination: a page never repeats or skips a row that stayed
put). Everything runs through ``runtime.rows(table, tenant=...)``: the tenant filter is the one
it always adds. The console reads a table through :class:`TableReads` too, in the tenant the
operator names.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import uuid
from collections.abc import Iterable
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

from pydantic_core import to_jsonable_python
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from akter._tables import OwnedTable
from akter.callers import ActorRef
from akter.errors import ActorError
from akter.http._tracing import http_span, http_status
from akter.http.auth import Identity

if TYPE_CHECKING:
    from akter.runtime import Runtime

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
#: Query parameters that are not filters.
RESERVED = frozenset({"after", "limit"})
_INT = re.compile(r"-?(0|[1-9][0-9]{0,18})")


class Host(Protocol):
    """What the route uses of the app (``akter.http.app``'s ``_Api``)."""

    runtime: Runtime

    async def identity(self, request: Request) -> Identity: ...

    def refused(self, request: Request, exc: ActorError) -> Response: ...


def _invalid(message: str, code: str) -> ActorError:
    return ActorError("InvalidInput", message, code=code)


class TableReads:
    """The owned tables of a runtime by name, and one page of a tenant's rows of one."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.tables: dict[str, OwnedTable] = {
            t.name: t for d in runtime.definitions.values() for t in d.tables
        }

    def table(self, name: str) -> OwnedTable:
        """The owned table named ``name`` (``unknown_table``, 404, otherwise)."""
        found = self.tables.get(name)
        if found is None:
            raise _invalid(f"No owned table {name[:200]!r}.", "unknown_table")
        return found

    async def page(
        self, owned: OwnedTable, tenant: str, params: Iterable[tuple[str, str]]
    ) -> dict[str, Any]:
        """``{"rows": [...], "next": cursor | None}``: one page of ``tenant``'s rows."""
        filters: dict[str, Any] = {}
        after: str | None = None
        limit = DEFAULT_LIMIT
        seen: set[str] = set()
        for name, text in params:
            if name in seen:
                raise _invalid(f"The parameter {name!r} is given twice.", "repeated_parameter")
            seen.add(name)
            if name == "after":
                after = text
            elif name == "limit":
                limit = _limit(text)
            else:
                filters[name] = _filter_value(owned, name, text)
        c = owned.table.c
        key = [c[col.name] for col in owned.table.primary_key.columns]
        rows = self.runtime.rows(owned.table, tenant=tenant)
        select = rows.select.where(*(c[name] == value for name, value in filters.items()))
        start = None if after is None else _decode(owned, key, after, tenant)
        found, _ = await rows.page(select, key=key, after=start, limit=limit + 1)
        more = len(found) > limit
        found = found[:limit]
        last = _encode(owned, key, found[-1]) if more else None
        return {"rows": to_jsonable_python(found, fallback=str, bytes_mode="base64"), "next": last}


def _limit(text: str) -> int:
    if re.fullmatch(r"[0-9]{1,3}", text) is None or not 1 <= int(text) <= MAX_LIMIT:
        raise _invalid(f"limit is a whole number from 1 to {MAX_LIMIT}.", "invalid_limit")
    return int(text)


def _filter_value(owned: OwnedTable, name: str, text: str) -> Any:
    """The value of the filter ``name=text``, of its column's type."""
    if name == owned.tenant_id:
        raise _invalid(
            f"{name!r} is the tenant's column: the rows are your tenant's, from your "
            "credentials, never from a parameter.",
            "tenant_filter",
        )
    column = owned.table.c.get(name)
    if column is None:
        raise _invalid(
            f"{owned.name!r} declares no column {name[:200]!r} to filter on.", "unknown_column"
        )
    return _typed(owned, name, column, text)


def _typed(owned: OwnedTable, name: str, column: Any, text: str) -> Any:
    """``text`` as a value of ``column``'s Python type (``invalid_filter`` when it is not one)."""
    try:
        kind = column.type.python_type
    except NotImplementedError:
        kind = None
    parse = _PARSERS.get(kind) if isinstance(kind, type) else None
    if parse is None:
        raise _invalid(
            f"The column {name!r} of {owned.name!r} ({column.type}) cannot be filtered on.",
            "unfilterable_column",
        )
    try:
        if "\x00" in text:
            raise ValueError("NUL")
        value = parse(text)
        if kind is int and not _int_range(column)[0] <= value <= _int_range(column)[1]:
            raise ValueError(text)
        return value
    except (ValueError, InvalidOperation, OverflowError):
        raise _invalid(
            f"{text[:100]!r} is not a value of the column {name!r} ({column.type}).",
            "invalid_filter",
        ) from None


def _int_range(column: Any) -> tuple[int, int]:
    """The values an integer column holds: 16, 32 or 64 bits (``numeric``: 64 here)."""
    import sqlalchemy as sa

    bits = 16 if isinstance(column.type, sa.SmallInteger) else 64
    if type(column.type) in (sa.Integer, sa.INTEGER):
        bits = 32
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _int(text: str) -> int:
    if _INT.fullmatch(text) is None or not -(2**63) <= int(text) < 2**63:
        raise ValueError(text)
    return int(text)


def _bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(text)
    return text == "true"


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not value.is_finite():
        raise ValueError(text)
    return value


_PARSERS: dict[type, Any] = {
    str: str,
    int: _int,
    bool: _bool,
    float: _float,
    Decimal: _decimal,
    datetime: datetime.fromisoformat,
    date: date.fromisoformat,
    time: time.fromisoformat,
    uuid.UUID: uuid.UUID,
}


def _encode(owned: OwnedTable, key: list[Any], row: dict[str, Any]) -> str:
    """The cursor after ``row``: its primary key but the tenant, as text, base64url."""
    values = [to_jsonable_python(row[k.key]) for k in key if k.name != owned.tenant_id]
    text = json.dumps([json.dumps(v) if isinstance(v, bool) else str(v) for v in values])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode(owned: OwnedTable, key: list[Any], cursor: str, tenant: str) -> tuple[Any, ...]:
    """The primary key a cursor names, with the caller's tenant in the tenant's place."""
    bad = ActorError(
        "UnknownCursor", f"{cursor[:100]!r} is not a cursor of {owned.name!r}.", code="malformed"
    )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        texts = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    columns = [k for k in key if k.name != owned.tenant_id]
    if (
        not isinstance(texts, list)
        or len(texts) != len(columns)
        or not all(isinstance(t, str) for t in texts)
    ):
        raise bad
    values = iter(texts)
    out: list[Any] = []
    for k in key:
        if k.name == owned.tenant_id:
            out.append(tenant)
            continue
        try:
            out.append(_typed(owned, k.name, k, next(values)))
        except ActorError:
            raise bad from None
    return tuple(out)


class TableRoutes:
    """``GET /tables/{table}`` of the app (module docstring)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.reads = TableReads(host.runtime)

    def routes(self) -> list[Route]:
        """The route, when some actor owns a table."""
        if not self.reads.tables:
            return []
        return [Route("/tables/{table}", self.rows, methods=["GET"])]

    async def rows(self, request: Request) -> Response:
        with http_span("GET", "/tables/{table}", request.headers) as span:
            response = await self._rows(request)
            http_status(span, response.status_code)
            return response

    async def _rows(self, request: Request) -> Response:
        host = self.host
        try:
            identity = await host.identity(request)
            host.runtime.require_started()
            owned = self.reads.table(str(request.path_params["table"]))
            assert owned.owner is not None  # claimed when its class was defined
            ref = ActorRef(identity.tenant, owned.owner, "")
            await host.runtime.check_access(ref, identity.caller, "rows", owned.name)
            page = await self.reads.page(owned, identity.tenant, request.query_params.multi_items())
        except ActorError as exc:
            return host.refused(request, exc)
        return JSONResponse(page, headers={"Cache-Control": "no-store"})


# --- the OpenAPI document -----------------------------------------------------------------------

_SCHEMAS: dict[type, dict[str, Any]] = {
    str: {"type": "string", "pattern": "^[^\\u0000]*$"},
    int: {"type": "integer"},  # bounded by the column's size (_filter_schema)
    bool: {"type": "boolean"},
    float: {"type": "number"},
    Decimal: {"type": "string", "pattern": r"^-?[0-9]{1,30}(\.[0-9]{1,30})?$"},
    datetime: {"type": "string", "format": "date-time"},
    date: {"type": "string", "format": "date"},
    uuid.UUID: {"type": "string", "format": "uuid"},
}
_ROW_SCHEMAS: dict[type, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    bool: {"type": "boolean"},
    float: {"type": "number"},
}


def _kind(column: Any) -> type | None:
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return None
    return kind if isinstance(kind, type) else None


def _filter_schema(column: Any) -> dict[str, Any]:
    kind = _kind(column)
    if kind is int:
        low, high = _int_range(column)
        return {"type": "integer", "minimum": low, "maximum": high}
    return _SCHEMAS[kind] if kind is not None else {}


def table_operation(
    owned: OwnedTable, security: list[dict[str, list[str]]], refusals: dict[str, Any]
) -> dict[str, Any]:
    """The ``GET /tables/{name}`` operation of one owned table."""
    owner = str(owned.owner)
    filters = [
        {
            "name": column.name,
            "in": "query",
            "schema": _filter_schema(column),
            "description": f"Rows whose `{column.name}` equals this value.",
        }
        for column in owned.table.columns
        if column.name != owned.tenant_id and _kind(column) in _SCHEMAS
    ]
    properties: dict[str, Any] = {}
    for column in owned.table.columns:
        schema = dict(_ROW_SCHEMAS.get(_kind(column) or object, {}))
        if schema and column.nullable:
            schema["type"] = [schema["type"], "null"]
        properties[column.name] = schema
    page = {
        "type": "object",
        "required": ["rows", "next"],
        "properties": {
            "rows": {"type": "array", "items": {"type": "object", "properties": properties}},
            "next": {
                "type": ["string", "null"],
                "description": "The cursor of the next page (`after`); null on the last page.",
            },
        },
    }
    return {
        "operationId": f"{owner}.rows.{owned.table.name}",
        "tags": [owner],
        "summary": f"The caller's tenant's rows of {owned.name}, in primary key order (access "
        "kind `rows` of the owner's policy).",
        "parameters": [
            *filters,
            {
                "name": "after",
                "in": "query",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,2000}$"},
                "description": "The `next` cursor of the previous page.",
            },
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                "description": f"Rows per page (default {DEFAULT_LIMIT}).",
            },
        ],
        "responses": {
            "200": {"description": "One page.", "content": {"application/json": {"schema": page}}},
            **refusals,
        },
        "security": security,
    }
