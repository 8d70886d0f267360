"""The common wrapper of a runner in a child process: its lines, signals and end, with deadlines.

Every drill speaks to its children through :class:`ChildProcess`: it starts them
(:func:`start_module`), reads their lines within a deadline, sends them signals (SIGKILL, SIGSTOP,
SIGCONT) and always ends them (:meth:`ChildProcess.close`, also on ``async with`` exit), so a
failing drill never leaves a child running or a pipe undrained.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from types import TracebackType
from typing import NoReturn, Self

import pytest

REPO = Path(__file__).resolve().parents[2]
LINE_WITHIN = 30.0
#: Longest wait for a killed child to be reaped and its pipes drained.
CLOSE_WITHIN = 30.0
#: How much of a child's stderr a failure message shows (the end, where a traceback is).
STDERR_TAIL = 8000


async def start_module(
    module: str, *argv: str, stdin: int = asyncio.subprocess.PIPE
) -> asyncio.subprocess.Process:
    """Start ``python -m module argv...`` in the repository, stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *argv,
        cwd=REPO,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


class ChildProcess:
    """A child process spoken to over stdin/stdout; stderr is always drained and kept."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str = "child") -> None:
        self.proc = proc
        self.pid = proc.pid
        self.name = name
        self.stderr = bytearray()
        self._collector = asyncio.create_task(self._collect(), name=f"{name} stderr")

    def fail(self, message: str) -> NoReturn:
        """Fail the drill (a pytest failure; drills run outside pytest raise their own error)."""
        pytest.fail(message)

    async def _collect(self) -> None:
        # Always drained, so a chatty child never blocks on a full pipe.
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr += chunk

    async def diagnosis(self) -> str:
        """Its exit status and (the end of) what it wrote on stderr."""
        if self.proc.returncode is None:
            status = "(still running; stderr so far)"
        else:
            await self._collector
            status = f"(exit {self.proc.returncode})"
        return f"{status}\n{self.stderr.decode(errors='replace')[-STDERR_TAIL:]}"

    async def line(self, within: float = LINE_WITHIN) -> str:
        """The next line the child prints, within a deadline."""
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        except TimeoutError:
            self.fail(f"no line from the {self.name} within {within} s {await self.diagnosis()}")
        if not raw:
            await self.proc.wait()
            self.fail(f"the {self.name} ended without answering {await self.diagnosis()}")
        return raw.decode().rstrip("\n")

    async def ready(self, within: float = 60.0) -> list[str]:
        """Wait for the child's first line, ``READY ...``, and return its fields after the word.

        A child that does not get ready is closed before the failure propagates.
        """
        try:
            line = await self.line(within)
            if not line.startswith("READY "):
                self.fail(f"unexpected first line {line!r} {await self.diagnosis()}")
            return line.split()[1:]
        except BaseException:
            await self.close()
            raise

    async def send(self, line: str) -> None:
        """Write one line to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    def end_input(self) -> None:
        """Close the child's stdin: the drills' children stop gracefully at end of input."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig``; a child already gone is not an error (it is reaped by :meth:`close`)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP: the process stops running, holding whatever it holds (it must be alive)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        self.signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL the child and reap it; it must have died by that signal."""
        os.kill(self.pid, signal.SIGKILL)
        if await self.proc.wait() != -signal.SIGKILL:
            self.fail(f"the {self.name} did not die by SIGKILL {await self.diagnosis()}")

    async def close(self, *, grace: float = 0.0, within: float = CLOSE_WITHIN) -> None:
        """Make sure the child is dead and every pipe is drained and closed.

        Args:
            grace: Seconds a running child gets to exit on end of input (resumed first, since
                a frozen child cannot) before it is SIGKILLed.
            within: Deadline for reaping it and draining its pipes after that.
        """
        if self.proc.returncode is None and grace > 0:
            self.resume()
            self.end_input()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace)
        if self.proc.returncode is None:
            self.signal(signal.SIGKILL)
        async with asyncio.timeout(within):
            await self.proc.wait()
            if self.proc.stdin is not None:
                self.proc.stdin.close()
                with contextlib.suppress(ConnectionError):
                    await self.proc.stdin.wait_closed()
            if self.proc.stdout is not None:
                await self.proc.stdout.read()
            await self._collector

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
