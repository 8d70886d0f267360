"""``akter citus distribute``: migrate a schema on a Citus coordinator and distribute its tables.

Idempotent: migrations already applied and tables already placed are left alone, so it can run
before every deploy. Per-actor tables are distributed by ``routing_key`` and co-located; the
tables that belong to no actor are reference tables (``docs/citus.md``). Pointed at a Citus
worker, or at a server without Citus, it refuses before writing anything. It warns when every
actor type is tenant-placed: each tenant's actors then share one shard, so a deployment with few
tenants spreads little load.
"""

from __future__ import annotations

import asyncio
import json

import typer

from akter.cli._common import JsonOption, TargetArg, load_runtime, refusals_exit, stderr, stdout
from akter.errors import ConfigurationError

citus_app = typer.Typer(name="citus", help="Run on Citus: distribute the schema's tables.")

#: The warning printed when every actor type is placed by tenant.
TENANT_WARNING = (
    "warning: every actor type is placed by tenant (placement='tenant', the default): all of a "
    "tenant's actors live in one shard, so an application with one or few tenants uses one or "
    "few workers; declare placement='actor' on types whose load should spread (docs/citus.md)."
)


@citus_app.command("distribute")
def distribute_command(target: TargetArg, as_json: JsonOption = False) -> None:
    """Apply pending migrations on the Citus coordinator, then distribute the schema's tables."""
    with refusals_exit():
        runtime = load_runtime(target)
        url = runtime.config.database_url
        if not url:
            raise ConfigurationError(
                "The runtime has no database_url: point it (or AKTER_DATABASE_URL) at the Citus "
                "coordinator; the embedded server has no Citus."
            )
        database = runtime.operators.database
        done = asyncio.run(database.distribute(url))
        tenant_only = database.all_tenant_placed
        if tenant_only:
            stderr.print(TENANT_WARNING)
        if as_json:
            print(
                json.dumps(
                    {
                        "schema": runtime.schema,
                        "distributed": done.distributed,
                        "reference": done.referenced,
                        "unchanged": done.already,
                        "all_tenant_placed": tenant_only,
                    }
                )
            )
            return
        changed = len(done.distributed) + len(done.referenced)
        stdout.print(
            f"schema {runtime.schema!r} is distributed on Citus: "
            + (f"{changed} tables placed now" if changed else "nothing to change")
            + f" ({len(done.already)} already placed)"
        )
