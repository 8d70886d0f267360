"""The console's "Tables" view: the owned tables, and one tenant's rows of one, read-only.

Routes, behind the same guard as every console API route (:mod:`akter.http.console.guard`)::

    GET /console/api/tables                  the owned tables: name, owner type, columns, key
    GET /console/api/table?table=&tenant=&after=&limit=&<column>=...   one page of rows

A page is what ``GET /tables/{table}`` answers (:class:`akter.http._tables.TableReads`: the same
filters, cursor and refusals), read through ``runtime.rows(table, tenant=...)`` for the tenant
the operator names (``default`` when none): the console sees every tenant, one at a time, and
no owner type's access policy is asked (the console's own rule admitted the operator).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from akter.callers import System
from akter.errors import ActorError
from akter.http._tables import TableReads
from akter.http.problems import from_actor_error

if TYPE_CHECKING:
    from akter.runtime import Runtime

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
#: Parameters of the console's table read that are not the page's own.
_OWN = frozenset({"table", "tenant"})


class TablesApi:
    """The table routes on ``runtime``; ``guard`` admits a request as an operator."""

    def __init__(self, runtime: Runtime, guard: Callable[[Request], Awaitable[System]]) -> None:
        self.reads = TableReads(runtime)
        self.guard = guard

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes, to add to the console's."""
        return [
            Route("/console/api/tables", self.tables, methods=["GET"]),
            Route("/console/api/table", self.table, methods=["GET"]),
        ]

    async def tables(self, request: Request) -> Response:
        """``GET /console/api/tables``: every owned table this runtime's actors declare."""
        try:
            await self.guard(request)
            found = [
                {
                    "table": name,
                    "owner": owned.owner,
                    "columns": [c.name for c in owned.table.columns],
                    "key": [c.name for c in owned.table.primary_key.columns],
                    "tenant_column": owned.tenant_id,
                }
                for name, owned in sorted(self.reads.tables.items())
            ]
            return _json({"tables": found})
        except ActorError as exc:
            return from_actor_error(exc)

    async def table(self, request: Request) -> Response:
        """``GET /console/api/table``: one page of a tenant's rows of one table."""
        try:
            await self.guard(request)
            params = request.query_params
            owned = self.reads.table(params.get("table", ""))
            tenant = params.get("tenant") or "default"
            rest = [(k, v) for k, v in params.multi_items() if k not in _OWN and v != ""]
            page = await self.reads.page(owned, tenant, rest)
            return _json({"table": owned.name, "tenant": tenant, **page})
        except ActorError as exc:
            return from_actor_error(exc)


def _json(body: Any) -> Response:
    return JSONResponse(body, headers=_HEADERS)
