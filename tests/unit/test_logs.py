"""``akter.logs.configure_logging``: a handler only when the application configured none."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from akter.logs import configure_logging


@pytest.fixture(autouse=True)
def akter_level() -> Iterator[None]:
    logger = logging.getLogger("akter")
    level = logger.level
    yield
    logger.setLevel(level)


def test_without_handlers_it_adds_one_that_prints_akter_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    stream = io.StringIO()
    handler = configure_logging("warning", stream=stream)
    assert handler is not None and logging.getLogger().handlers == [handler]
    logging.getLogger("akter.jobs").info("not shown")
    logging.getLogger("akter.jobs").warning("Job %s dead-lettered", "j-1")
    assert stream.getvalue().endswith(" WARNING akter.jobs: Job j-1 dead-lettered\n")
    assert "not shown" not in stream.getvalue()


def test_an_application_handler_is_kept_and_only_the_level_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [own])
    assert configure_logging(logging.DEBUG) is None
    assert logging.getLogger().handlers == [own]
    assert logging.getLogger("akter").level == logging.DEBUG


def test_an_unknown_level_name_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown log level 'LOUD'"):
        configure_logging("LOUD")
