"""Pytest plugin: a real PostgreSQL for akter tests.

``akter_db`` (session) is the database URL: ``$AKTER_TEST_DATABASE_URL`` when set, else an
embedded PostgreSQL under ``<rootdir>/.akter-test`` started once per session. ``akter_test``
builds :class:`~akter.testing.ActorTest` harnesses on it, each with a fresh schema (a cluster
with ``akter_test([Order], runners=3)``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from akter.testing.harness import ActorTest


@pytest.fixture(scope="session")
def akter_db(request: pytest.FixtureRequest) -> Iterator[str]:
    """The PostgreSQL URL the tests run against."""
    url = os.environ.get("AKTER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    from akter.errors import ConfigurationError
    from akter.operators.database import EmbeddedPostgres

    data_dir = Path(str(request.config.rootpath)) / ".akter-test"
    data_dir.mkdir(exist_ok=True)
    server = EmbeddedPostgres(data_dir)
    private: Path | None = None
    try:
        url = server.start()
    except ConfigurationError:
        # Another test session owns that server: run a throwaway one for this session.
        private = Path(tempfile.mkdtemp(prefix="akter-test-"))
        server = EmbeddedPostgres(private)
        url = server.start()
    try:
        yield url
    finally:
        server.stop()
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


@pytest.fixture
def akter_test(akter_db: str) -> Callable[..., ActorTest]:
    """Build ActorTest harnesses, each on a fresh schema.

    Example: ``async with akter_test([Order]) as t: ...``; several runners:
    ``async with akter_test([Order], runners=3) as t: await t.kill(1)``.
    """

    def make(actors: Sequence[type[Any]], **options: Any) -> ActorTest:
        return ActorTest(actors, database_url=akter_db, **options)

    return make
