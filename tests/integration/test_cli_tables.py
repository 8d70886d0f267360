"""CLI tables at 80 columns, short ids, ``--wide`` and ``--json``, on real PostgreSQL rows.

Every list command is run as a subprocess with ``COLUMNS=80`` (what rich uses when stdout is not
a terminal) over rows with real 70-odd-character ids and long actor ids: no line may be wider
than 80 cells and every table row must take exactly one line. The short ids the tables show are
then given back to the commands that take ids: each resolves to its one full id, and a short id
that matches two rows is refused with both named.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.cells import cell_len

from akter.cli._tables import id_key, resolve_id, short_ids
from akter.errors import ConfigurationError
from tests.integration import test_cli, test_cli_workflows
from tests.integration.test_cli import cliapp_runtime, dead_letters, run

project = test_cli.project

pytestmark = pytest.mark.timeout(240)

#: Long actor ids: the free-text columns must be cut, not wrapped.
LONG = "customer-with-a-rather-long-identifier-{}"


def table_rows(out: str, title: str, width: int = 80) -> list[str]:
    """The row lines of the table titled ``title``; fails if a line of it wraps or is too wide."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    top, header, rule = lines[start + 1 : start + 4]
    assert top.startswith("┏") and header.startswith("┃") and rule.startswith("┡"), out
    end = next(i for i in range(start + 4, len(lines)) if lines[i].startswith("└"))
    table = lines[start : end + 1]
    too_wide = [line for line in table if cell_len(line) > width]
    assert not too_wide, "\n".join(too_wide)
    rows = table[4:-1]
    assert all(line.startswith("│") for line in rows), out
    return rows


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("│").split("│")]


def shown(cli: Any, title: str, n: int) -> list[list[str]]:
    assert cli.returncode == 0, cli.stderr
    rows = table_rows(cli.stdout, title)
    assert len(rows) == n, cli.stdout  # one line per row: nothing wrapped
    return [cells(r) for r in rows]


def sql(project: dict[str, str], statement: str) -> list[Any]:
    with psycopg.connect(project["CLI_URL"], autocommit=True) as conn:
        cur = conn.execute(statement.replace("{schema}", f'"{project["schema"]}"'))
        return cur.fetchall() if cur.description else []


def test_short_ids_grow_until_unique_and_resolve_back() -> None:
    a = "v1.1765000000000.1765086400000.3f2a9c1b-1111-4aaa-8bbb-000000000001"
    b = "v1.1765000000000.1765086400000.3f2a9c1b-2222-4aaa-8bbb-000000000002"
    c = "v1.1765000000001.1765086400001.77aa0000-1111-4aaa-8bbb-000000000003"
    assert short_ids([c]) == {c: "77aa0000…"}
    grown = short_ids([a, b, c])
    assert grown == {a: "3f2a9c1b-1…", b: "3f2a9c1b-2…", c: "77aa0000-1…"}
    run_id = a + "~0123456789ab"
    assert id_key(run_id).endswith("~0123456789ab") and short_ids([run_id]) == {run_id: "3f2a9c1b…"}
    assert short_ids(["sig-1"]) == {"sig-1": "sig-1"}  # not an akter id, and short: whole
    pool = [a, b, c]
    assert resolve_id("77aa", pool, "job") == c
    assert resolve_id("3f2a9c1b-2…", pool, "job") == b  # as the table shows it
    assert resolve_id(a, [], "job") == a  # a full id is used as given
    with pytest.raises(ConfigurationError, match=r"matches 2 jobs \(v1\..*3f2a9c1b-1111.*2222"):
        resolve_id("3f2a9c1b", pool, "job")
    with pytest.raises(ConfigurationError, match="No job 'dead'"):
        resolve_id("dead", pool, "job")
    with pytest.raises(ConfigurationError, match="at least 4 characters"):
        resolve_id("3f", pool, "job")


async def test_every_list_fits_80_columns_and_takes_its_short_ids(
    project: dict[str, str],
) -> None:
    project["COLUMNS"] = "80"
    assert run(project, "migrate", "cliapp:runtime").returncode == 0
    async with cliapp_runtime(project) as cliapp:
        letters = await dead_letters(cliapp, -1, -2, -3)
    async with cliapp_runtime(project, relay=False, jobs=[]) as cliapp:
        rt = cliapp.runtime
        for i in range(3):  # receipts and 'later' timers of long-named actors
            await rt.get(cliapp.Counter, LONG.format(i)).add(i + 1)
        jobs = [await rt.get(cliapp.Counter, LONG.format(i)).pay(i + 1) for i in range(2)]
    # Two timers parked (what the relay does to rows the code cannot deliver), with a long error.
    sql(
        project,
        "UPDATE {schema}.outbox SET parked_at_ms = 1000, last_error = 'InvalidInput: "
        + "the payload no longer validates against the signature of the command " * 2
        + "' WHERE kind = 'intent' AND actor_id IN ('"
        + LONG.format(0)
        + "', '"
        + LONG.format(1)
        + "')",
    )

    # jobs list: short ids, one line per job; --wide shows them whole; --json always whole.
    listed = shown(run(project, "jobs", "list", "cliapp:runtime"), "jobs", 2)
    short = short_ids(jobs)
    assert sorted(r[0] for r in listed) == sorted(short.values())
    assert all(len(r[0]) < 12 for r in listed)
    wide = run(project, "jobs", "list", "cliapp:runtime", "--wide")
    assert wide.returncode == 0, wide.stderr
    assert all(any(job in line for line in wide.stdout.splitlines()) for job in jobs)
    assert len(table_rows(wide.stdout, "jobs", width=10_000)) == 2
    as_json = json.loads(run(project, "jobs", "list", "cliapp:runtime", "--json").stdout)
    assert sorted(j["job_id"] for j in as_json) == sorted(jobs)
    unknown = run(project, "jobs", "watch", "cliapp:runtime", "Counter", "x", "0000zzzz")
    assert unknown.returncode == 1 and "No job '0000zzzz'" in unknown.stderr

    # dead letters: list, then show / retry / discard by the short ids the list showed.
    listed = shown(run(project, "dead-letters", "list", "cliapp:runtime"), "dead letters", 3)
    by_short = {short: full for full, short in short_ids(letters).items()}
    assert {r[0] for r in listed} == set(by_short)
    first, second = listed[0][0], listed[1][0]
    letter = run(project, "dead-letters", "show", "cliapp:runtime", first)
    assert letter.returncode == 0, letter.stderr
    assert json.loads(letter.stdout)["job_id"] == by_short[first]
    retried = run(project, "dead-letters", "retry", "cliapp:runtime", first.rstrip("…"))
    assert retried.returncode == 0, retried.stderr
    discarded = run(project, "dead-letters", "discard", "cliapp:runtime", second)
    assert discarded.stdout.split() == ["discarded", by_short[second]]
    left = json.loads(run(project, "dead-letters", "list", "cliapp:runtime", "--json").stdout)
    assert [x["job_id"] for x in left] == [
        full for full in letters if full not in (by_short[first], by_short[second])
    ]

    # jobs cancel by a short id (the retried letter is a new job row).
    new_job = retried.stdout.strip()
    cancelled = run(project, "jobs", "cancel", "cliapp:runtime", id_key(new_job)[:10])
    assert (cancelled.returncode, cancelled.stdout.strip()) == (0, "deleted"), cancelled.stderr

    # outbox: pending rows (the unparked timer and the two jobs) and the parked ones.
    pending = json.loads(run(project, "outbox", "cliapp:runtime", "--json").stdout)
    shown(run(project, "outbox", "cliapp:runtime"), "outbox", len(pending))
    parked = shown(run(project, "outbox", "parked", "cliapp:runtime"), "parked rows", 2)
    assert all(r[-1].endswith("…") for r in parked)  # the long error is cut, not wrapped

    # inspect: receipts and outbox of a long-named actor.
    args = ("inspect", "cliapp:runtime", "Counter", LONG.format(0))
    report = json.loads(run(project, *args, "--json").stdout)
    inspected = run(project, *args)
    receipts = shown(inspected, "receipts", len(report["receipts"]))
    assert receipts and all(r[0].endswith("…") for r in receipts)
    assert len(table_rows(inspected.stdout, "outbox")) == len(report["outbox"]) > 0

    # Two parked rows whose ids share 8 characters: the table shows more of each, a short id
    # that matches both is refused naming both, and a longer one picks one.
    [(p0,), (p1,)] = sql(
        project, "SELECT intent_id FROM {schema}.outbox WHERE parked_at_ms IS NOT NULL"
    )
    twins = [
        f"{p.rsplit('.', 1)[0]}.abcd0123-{n}{id_key(p)[10:]}" for n, p in (("1", p0), ("2", p1))
    ]
    for old, new in zip((p0, p1), twins, strict=True):
        sql(project, f"UPDATE {{schema}}.outbox SET intent_id = '{new}' WHERE intent_id = '{old}'")
    parked = shown(run(project, "outbox", "parked", "cliapp:runtime"), "parked rows", 2)
    assert sorted(r[0] for r in parked) == ["abcd0123-1…", "abcd0123-2…"]
    ambiguous = run(project, "outbox", "retry", "cliapp:runtime", "abcd0123")
    assert ambiguous.returncode == 1
    assert "matches 2 parked rows" in ambiguous.stderr
    assert twins[0] in ambiguous.stderr and twins[1] in ambiguous.stderr
    still = "SELECT count(*) FROM {schema}.outbox WHERE parked_at_ms IS NOT NULL"
    assert sql(project, still) == [(2,)]  # nothing changed
    retried = run(project, "outbox", "retry", "cliapp:runtime", "abcd0123-2…")
    assert retried.returncode == 0, retried.stderr
    assert sql(project, "SELECT intent_id FROM {schema}.outbox WHERE parked_at_ms IS NOT NULL") == [
        (twins[0],)
    ]


@pytest.fixture
def wf_project(tmp_path: Path, akter_db: str) -> Iterator[dict[str, str]]:
    """The workflows app of test_cli_workflows in a project of its own."""
    (tmp_path / "wfapp.py").write_text(test_cli_workflows.APP)
    schema = f"clitab_{uuid.uuid4().hex[:10]}"
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CLI_URL": akter_db, "CLI_SCHEMA": schema, "PYTHONPATH": path}
    yield {"cwd": str(tmp_path), "schema": schema, **env, "COLUMNS": "80"}
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_workflow_tables_fit_80_columns_and_take_short_run_ids(
    wf_project: dict[str, str],
) -> None:
    project = wf_project
    with test_cli_workflows.App(project) as app:
        async with app.runtime as rt:
            waiting = await rt.get(app.Order, LONG.format("o1")).shipping.start()
            sleeping = await rt.get(app.Order, LONG.format("o2")).napper.start()
            await test_cli_workflows.drain(rt)
    assert len(waiting.id) > 70  # a real run id: v1.<ms>.<ms>.<uuid4>~<digest>

    listed = shown(test_cli_workflows.cli(project, "list"), "workflow runs", 2)
    by_short = {short: full for full, short in short_ids([waiting.id, sleeping.id]).items()}
    assert {r[0] for r in listed} == set(by_short)
    status = {by_short[r[0]]: r[3] for r in listed}
    assert status[waiting.id].startswith("suspended: signal")
    wide = test_cli_workflows.cli(project, "list", "--wide")
    assert len(table_rows(wide.stdout, "workflow runs", width=10_000)) == 2
    assert waiting.id in wide.stdout and sleeping.id in wide.stdout

    short = next(s for s, full in by_short.items() if full == waiting.id)
    detail = test_cli_workflows.cli(project, "show", short)
    assert detail.returncode == 0, detail.stderr
    assert f"run {waiting.id}" in detail.stdout
    assert len(table_rows(detail.stdout, "steps")) == 2
    sent = test_cli_workflows.cli(project, "signal", short, "Shipped", '{"tracking": "T-9"}')
    assert sent.returncode == 0, sent.stderr
    assert f"sent Shipped to run {waiting.id}" in sent.stdout
    signals = test_cli_workflows.cli(project, "show", short)
    [(signal_id,)] = test_cli_workflows.sql(
        project, "SELECT signal_id FROM {schema}.workflow_signals"
    )
    [row] = table_rows(signals.stdout, "signals")
    assert cells(row)[0] == short_ids([signal_id])[signal_id]
    cancelled = test_cli_workflows.cli(project, "cancel", id_key(sleeping.id)[:6])
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancel requested for run {sleeping.id}" in cancelled.stdout
    missing = test_cli_workflows.cli(project, "show", uuid.uuid4().hex[:8])
    assert missing.returncode == 1 and "No workflow run" in missing.stderr
