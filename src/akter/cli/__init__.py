"""The ``akter`` command line (typer).

One sub-app per module, composed here on :data:`app`: ``serve`` and ``worker``
(:mod:`~akter.cli.runner`), ``migrate`` (:mod:`~akter.cli.migrate`), ``check``
(:mod:`~akter.cli.check`), ``inspect`` and ``outbox`` (:mod:`~akter.cli.inspection`,
:mod:`~akter.cli.outbox`), ``dev`` (:mod:`~akter.cli.dev`), ``bench`` (:mod:`~akter.cli.bench`),
``db`` (:mod:`~akter.cli.db`), ``jobs`` (:mod:`~akter.cli.jobs`), ``dead-letters``
(:mod:`~akter.cli.dead_letters`), ``workflows`` (:mod:`~akter.cli.workflows`) and ``citus``
(:mod:`~akter.cli.citus`). The
modules share only :mod:`akter.cli._common` (output, options, targets) and
:mod:`akter.cli._serving`; none imports this package or another command module.

Commands print results on stdout (plain, so that ``$(akter db url)`` works) and progress and
errors on stderr through rich: a long operation shows a progress bar (:class:`Steps`) only when
stderr is a terminal, and plain lines otherwise, so ``--json`` output is never corrupted. A
refusal (:class:`~akter.errors.AkterError`) exits with code 1 and its one-sentence message,
without a traceback.

Tables fit the console (80 columns when stdout is not a terminal and ``$COLUMNS`` is unset): ids
are shown short (``3f2a9c1b…``, the start of an id's random part, longer where two would look
alike), times as ``MM-DD HH:MM:SS`` UTC, and free text is cut; ``--wide`` shows everything in
full and ``--json`` is always full. Every command that takes an id also takes its short form
(:mod:`akter.cli._tables` has the rule).
"""

from __future__ import annotations

from akter._extras import require_extra

try:
    import typer

    from akter.cli._common import Steps
    from akter.cli.bench import bench_app
    from akter.cli.check import check_app
    from akter.cli.citus import citus_app
    from akter.cli.db import db_app
    from akter.cli.dead_letters import letters_app
    from akter.cli.dev import dev_app
    from akter.cli.inspection import inspection_app
    from akter.cli.jobs import jobs_app
    from akter.cli.migrate import migrate_app
    from akter.cli.outbox import outbox_app
    from akter.cli.runner import runner_app
    from akter.cli.workflows import workflows_app
except ModuleNotFoundError as exc:  # typer, rich, ...: pip install 'akter[cli]'
    require_extra(exc, "The akter command line", "cli")
    raise

app = typer.Typer(
    name="akter",
    help="Durable actors on PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# The order of registration is the order of ``akter --help``: nameless sub-apps add their
# commands to the root (listed first, as they come), named ones add a group each.
for sub_app in (runner_app, migrate_app, check_app, inspection_app, dev_app, bench_app):
    app.add_typer(sub_app)
for group in (db_app, jobs_app, letters_app, outbox_app, workflows_app, citus_app):
    app.add_typer(group)


def main() -> None:
    """Run the ``akter`` command line (the console script's entry point)."""
    app()


__all__ = ["Steps", "app", "db_app", "main"]
