"""The common wrapper of a runner in a child process: its lines, with deadlines, and diagnoses."""

from __future__ import annotations

import asyncio

import pytest

LINE_WITHIN = 30.0


class ChildProcess:
    """A child process spoken to over stdin/stdout; stderr is always drained and kept."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str = "child") -> None:
        self.proc = proc
        self.pid = proc.pid
        self._stderr = bytearray()
        self._collector = asyncio.create_task(self._collect(), name=f"{name} stderr")

    async def _collect(self) -> None:
        # Always drained, so a chatty child never blocks on a full pipe.
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._stderr += chunk

    async def diagnosis(self) -> str:
        """Its exit status and what it wrote on stderr."""
        if self.proc.returncode is None:
            return f"(still running; stderr so far)\n{self._stderr.decode(errors='replace')}"
        await self._collector
        return f"(exit {self.proc.returncode})\n{self._stderr.decode(errors='replace')}"

    async def line(self, within: float = LINE_WITHIN) -> str:
        """The next line the child prints, within a deadline."""
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        except TimeoutError:
            pytest.fail(f"no line from the child within {within} s {await self.diagnosis()}")
        if not raw:
            await self.proc.wait()
            pytest.fail(f"the child ended without answering {await self.diagnosis()}")
        return raw.decode().rstrip("\n")
