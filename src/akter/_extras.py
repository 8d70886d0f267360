"""The optional surfaces and the extras that install them (``pip install 'akter[http]'``).

The core (actors, jobs, workflows, the relay, the test kit) needs none of these. A surface
imported without its extra fails with an :class:`ImportError` that names the extra::

    try:
        import httpx
    except ModuleNotFoundError as exc:
        require_extra(exc, "akter.client", "http")
        raise
"""

from __future__ import annotations

from typing import Literal

Extra = Literal["http", "cli"]

_HTTP = frozenset({"starlette", "uvicorn", "httpx", "jwt", "cryptography"})

#: The top-level modules each extra installs (``pyproject.toml``'s optional dependencies).
EXTRA_MODULES: dict[Extra, frozenset[str]] = {
    "http": _HTTP,
    # The command line serves the HTTP surface (`akter serve`, `akter dev`): cli includes http.
    "cli": _HTTP | {"typer", "click", "rich"},
}


def require_extra(error: ModuleNotFoundError, surface: str, extra: Extra) -> None:
    """Raise an :class:`ImportError` naming ``extra`` when ``error`` is one of its modules.

    Returns (so the caller re-raises ``error``) when the missing module is none of the extra's:
    that is a broken installation or a bug, not a missing extra.
    """
    missing = (error.name or "").partition(".")[0]
    if missing in EXTRA_MODULES[extra]:
        raise ImportError(
            f"{surface} needs {missing!r}, which is not installed; it comes with akter's "
            f"{extra!r} extra: pip install 'akter[{extra}]'",
            name=missing,
        ) from error
