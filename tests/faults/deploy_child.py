"""A runner on one version of the rolling-deploy drill's code, in a child process.

Usage (from the repository root)::

    python -m tests.faults.deploy_child URL SCHEMA --code v1|v2

It runs ``akter.Runtime`` over every type of ``tests.faults.deploy_<code>`` with the relay on.
Protocol on stdout: ``READY <runner_id>`` once started. Input lines
``CALL <tag> <command id or -> <Type> <actor id> <command> <token>`` call the command with
``{"token": token}`` and ``retry=False`` (``-``: a fresh command id), concurrently; each ends with
``DONE <tag> <command id> ok`` or ``DONE <tag> <command id> error <reason> <retryable 0|1>
<retry_after>``. End of input stops the runtime gracefully, prints ``STOPPED`` and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys

import akter


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(args: argparse.Namespace) -> int:
    """Serve calls until end of input (or until killed)."""
    code = importlib.import_module(f"tests.faults.deploy_{args.code}")
    runtime = akter.Runtime(
        list(code.CLASSES.values()),
        database_url=args.url,
        schema=args.schema,
        maintenance=False,
        relay=True,
        poll=0.05,
    )
    calls: set[asyncio.Task[None]] = set()

    async def call(
        tag: str, cid: str, type_name: str, actor: str, command: str, token: str
    ) -> None:
        if cid == "-":
            cid = await runtime.mint_command_id()
        try:
            await runtime.call(
                code.CLASSES[type_name],
                actor,
                command,
                {"token": token},
                command_id=cid,
                retry=False,
            )
        except akter.ActorError as exc:
            retryable = int(exc.retryable)
            say(f"DONE {tag} {cid} error {exc.reason} {retryable} {exc.retry_after or 0}")
        except Exception as exc:  # a drill must hear of anything, not hang
            say(f"DONE {tag} {cid} error {type(exc).__name__} 0 0")
        else:
            say(f"DONE {tag} {cid} ok")

    async with runtime:
        say(f"READY {runtime._runners.runner_id}")
        while line := await asyncio.to_thread(sys.stdin.readline):
            words = line.split()
            if words[:1] == ["CALL"] and len(words) == 7:
                task = asyncio.create_task(call(*words[1:]))
                calls.add(task)
                task.add_done_callback(calls.discard)
        await asyncio.gather(*calls)
    say("STOPPED")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.deploy_child")
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("--code", choices=("v1", "v2"), required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse(sys.argv[1:]))))
