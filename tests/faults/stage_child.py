"""A child process that stages a command in its own transaction, for the SIGKILL drill.

``python -m tests.faults.stage_child URL SCHEMA TAG ACTOR_ID``: opens a psycopg connection
(``application_name=TAG``), begins a transaction, stages ``Account.deposit(cents=5)`` and prints
``STAGED <command id>``; then waits for a stdin line: ``COMMIT`` commits and prints
``COMMITTED``, after which it waits for stdin to end. The drill SIGKILLs it at either wait.
"""

from __future__ import annotations

import sys

import psycopg

import akter
from tests.integration.stage_actors import Account


def main() -> None:
    url, schema, tag, actor_id = sys.argv[1:5]
    with psycopg.connect(url, application_name=tag) as conn:
        conn.execute("SELECT 1")  # the application's own work, in the same transaction
        cid = akter.stage(conn, Account, actor_id, schema=schema).deposit(cents=5)
        print(f"STAGED {cid}", flush=True)
        if sys.stdin.readline().strip() == "COMMIT":
            conn.commit()
            print("COMMITTED", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
