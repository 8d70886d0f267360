"""Each test starts with the logging the process started with.

``akter serve``/``worker``/``dev`` configure logging (``akter.logs.configure_logging``: the
``akter`` logger's level, a root handler when there is none), and the CLI's tests run them in
this process: without this fixture a later test would see INFO lines it never asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def logging_as_found() -> Iterator[None]:
    """Restore the ``akter`` logger's level and the root logger's handlers after the test."""
    akter = logging.getLogger("akter")
    root = logging.getLogger()
    level, handlers = akter.level, list(root.handlers)
    yield
    akter.setLevel(level)
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
