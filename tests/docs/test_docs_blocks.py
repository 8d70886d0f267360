"""Every Python block of the README and the docs is a complete file, and runs.

A page's ```python block runs as its own file in a fresh directory (its embedded data directory
would be ``./.akter`` there), on a database of the docs' own on the test server that holds no
schema when the block starts, so no two blocks share a schema or rows. A block that defines
``test_`` functions runs under pytest (``asyncio_mode = "auto"``, the ``akter_test`` fixture on
that database); any other runs with ``python``.

An HTML comment on the line before a block says how it is treated:

- ``<!-- file: shop.py -->``: the block is saved as ``shop.py``; later blocks of the same page run
  beside the last block saved under each name (the tutorial's steps import ``shop``);
- ``<!-- run-by: tests/integration/test_x.py -->``: a test of its own runs the block (and checks
  what it prints or asserts more); that file must name the page;
- ``<!-- not-run: reason -->``: a fragment or transcript that is not a program; the reason is
  required, and the count of such blocks is pinned below so that a new one is a decision.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>file|run-by|not-run):\s*(?P<value>.*?)\s*-->\s*$")

#: Blocks that are not programs (fragments, the specification's sketches). Raise it only for a
#: block that cannot be a complete file; make the others run.
NOT_RUN = 11


@dataclass(frozen=True)
class Block:
    """One ```python block of a page."""

    page: Path
    line: int
    code: str
    marks: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_test_module(self) -> bool:
        return re.search(r"^(async )?def test_", self.code, flags=re.M) is not None


def blocks(page: Path) -> Iterator[Block]:
    """The page's python blocks, with the marks on the line before each."""
    lines = page.read_text("utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, indent = i, fence["indent"]
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if fence["lang"] == "python":
            marks = {}
            before = _MARK.match(lines[start - 1]) if start else None
            if before:
                marks[before["kind"]] = before["value"]
            body = "\n".join(line.removeprefix(indent) for line in lines[start + 1 : i])
            yield Block(page, start + 1, textwrap.dedent(body) + "\n", marks)
        i += 1


ALL = [block for page in PAGES for block in blocks(page)]
RUN = [b for b in ALL if not b.marks.keys() & {"run-by", "not-run"}]


def test_every_block_is_run_or_says_why() -> None:
    run_by = [b for b in ALL if "run-by" in b.marks]
    not_run = [b for b in ALL if "not-run" in b.marks]
    for block in run_by:
        test = ROOT / block.marks["run-by"]
        assert test.is_file(), block.name
        page = str(block.page.relative_to(ROOT))
        assert page in test.read_text("utf-8"), f"{test} does not name {page} ({block.name})"
    for block in not_run:
        assert block.marks["not-run"], f"{block.name}: a not-run block says why"
    assert len(RUN) + len(run_by) + len(not_run) == len(ALL)
    assert len(not_run) == NOT_RUN, [b.name for b in not_run]
    assert len(RUN) >= 15  # the walk found the pages' blocks


@pytest.fixture(scope="module")
def docs_database(akter_db: str) -> Iterator[str]:
    """A database of the blocks' own on the test server, dropped at the end.

    One for the module, emptied after each block (below): dropping a database makes PostgreSQL
    checkpoint, which on a busy server costs seconds, while dropping its schemas does not.
    """
    name = f"akter_docs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(akter_db, dbname=name)
    finally:
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def database(docs_database: str) -> Iterator[str]:
    """The blocks' database with nothing in it: each block starts from no schema of its own."""
    yield docs_database
    with psycopg.connect(docs_database, autocommit=True) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname <> 'public'"
            " AND nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'"
        ).fetchall()
        for (schema,) in left:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.name)
def test_the_block_runs(block: Block, database: str, tmp_path: Path) -> None:
    for earlier in ALL:
        if earlier.page == block.page and earlier.line < block.line and "file" in earlier.marks:
            (tmp_path / earlier.marks["file"]).write_text(earlier.code, "utf-8")
    script = tmp_path / block.marks.get("file", "block.py")
    script.write_text(block.code, "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKTER_", "PYTEST_"))}
    env.update(
        AKTER_DATABASE_URL=database,
        AKTER_TEST_DATABASE_URL=database,
        AKTER_DATA_DIR=str(tmp_path / ".akter"),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]),
    )
    argv = [sys.executable, script.name]
    if block.is_test_module:
        # Only the plugins such a test needs: the others installed here take seconds to load.
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        argv[1:] = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto"]
        argv += ["-p", "pytest_asyncio.plugin", "-p", "akter.testing.plugin"]
        argv += ["--rootdir", str(tmp_path), script.name]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170, check=False
    )
    assert done.returncode == 0, f"{block.name}\n{done.stdout}\n{done.stderr}"
