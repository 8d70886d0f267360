"""Printing akter's log lines: the default an application (or ``akter serve``) can take.

akter logs through :mod:`logging` under the ``akter`` logger and, as a library, configures
nothing: without a handler, its records go nowhere. Every line names its subject in the text
(the actor, job id, run id or intent id, and the cause), so a plain format is enough to see
what failed; the same identities are in the record's ``extra`` fields for structured handlers.

:func:`configure_logging` is the default the docs recommend and what ``akter serve``, ``akter
worker`` and ``akter dev`` call (``--log-level``): akter's records at ``INFO`` and above, printed
to stderr as ``2026-12-06 16:20:01,123 WARNING akter.workflows: Workflow run failed: …``, unless
the application already configured a handler on the root logger (then it only sets the level).
"""

from __future__ import annotations

import logging
from typing import TextIO

#: The format of the default handler: time, level, logger, message.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(
    level: int | str = logging.INFO, *, stream: TextIO | None = None
) -> logging.Handler | None:
    """Show akter's log lines at ``level`` and above; add a stderr handler if there is none.

    The ``akter`` logger is set to ``level``. If the root logger has no handler (the application
    configured no logging), one :class:`logging.StreamHandler` with :data:`FORMAT` is added to
    it, so akter's lines (and the application's own warnings) are printed. An application that
    configured logging keeps its handlers and format.

    Args:
        level: A :mod:`logging` level or its name (``"DEBUG"``, ``"INFO"``, ``"WARNING"``…).
        stream: Where the added handler writes (default ``sys.stderr``).

    Returns:
        The handler added, or ``None`` when the application already had one.

    Raises:
        ValueError: ``level`` is not a level name.
    """
    if isinstance(level, str):
        named = logging.getLevelNamesMapping().get(level.upper())
        if named is None:
            raise ValueError(
                f"Unknown log level {level!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL."
            )
        level = named
    logging.getLogger("akter").setLevel(level)
    root = logging.getLogger()
    if root.handlers:
        return None
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    return handler


__all__ = ["FORMAT", "configure_logging"]
