"""``akter migrate``: apply the pending migrations, with a progress bar over them.

The pending migrations are counted before the runtime starts (unless the runtime starts its own
embedded server: then the bar's total is unknown); the migrator's "Applied migration" log
records advance the bar as the runtime's start applies them.
"""

from __future__ import annotations

import asyncio
import json
import logging

import typer

from akter.cli._common import (
    JsonOption,
    Steps,
    TargetArg,
    load_runtime,
    quiet,
    refusals_exit,
    stdout,
)
from akter.runtime import Runtime

migrate_app = typer.Typer()


@migrate_app.command("migrate")
def migrate_command(target: TargetArg, as_json: JsonOption = False) -> None:
    """Apply pending migrations for the runtime's database and schema, then exit."""
    with refusals_exit():
        runtime = quiet(load_runtime(target))
        applied: list[str] = []

        async def run() -> None:
            pending = await _pending_migrations(runtime)
            total = None if pending is None else len(pending)
            with Steps("migrating", total) as steps, _MigrationSteps(steps, applied):
                async with runtime:
                    pass

        asyncio.run(run())
        if as_json:
            print(json.dumps({"schema": runtime.schema, "applied": applied}))
            return
        stdout.print(f"schema {runtime.schema!r} is up to date")


async def _pending_migrations(runtime: Runtime) -> list[str] | None:
    """The ids of the migrations not yet applied; ``None`` when the database is not up yet."""
    database = runtime.operators.database
    known = database.known_migrations()
    url = runtime.config.database_url
    if not url:
        return None  # an embedded server the runtime starts itself: counted while applied
    applied = await database.applied_migrations(url)
    return [m for m in known if m not in applied]


class _MigrationSteps(logging.Handler):
    """Advances a progress bar on each "Applied migration" record of the migrator."""

    def __init__(self, steps: Steps, applied: list[str]) -> None:
        super().__init__(logging.INFO)
        self.steps = steps
        self.applied = applied
        self._logger = logging.getLogger("akter._store.migrate")
        self._level = self._logger.level

    def __enter__(self) -> _MigrationSteps:
        self._logger.addHandler(self)
        if not self._logger.isEnabledFor(logging.INFO):
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def emit(self, record: logging.LogRecord) -> None:
        migration = getattr(record, "migration", None)
        if migration is not None:
            self.applied.append(str(migration))
            self.steps.update(len(self.applied), message=str(migration))


__all__ = ["migrate_app"]
