"""A runner of the demo in a child process: started, read line by line, SIGKILLed, reaped.

Parts 4 (``demo.py --runner``) and 6 (``demo_workflows.py --runner``) of the demo use it.
"""

from __future__ import annotations

import asyncio
import os
import sys

#: How long a child runner may stay silent before the demo gives up on it.
CHILD_WITHIN = 60.0


class RunnerProcess:
    """A runner in a child process (parts 4 and 6 of the demo); stderr is always drained."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._stderr = bytearray()
        self._drain = asyncio.create_task(self._collect(), name="demo runner stderr")

    @classmethod
    async def start(cls, *argv: str, env: dict[str, str] | None = None) -> RunnerProcess:
        """Run ``python *argv`` as a child process (its stdin, stdout and stderr are pipes)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
        )
        return cls(proc)

    async def _collect(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._stderr += chunk

    async def line(self, within: float = CHILD_WITHIN) -> str:
        """The next line it prints, within a deadline."""
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        except TimeoutError:
            raise RuntimeError(f"The runner process said nothing for {within} s.") from None
        if not raw:
            await self.proc.wait()
            await self._drain
            raise RuntimeError(
                f"The runner process ended (exit {self.proc.returncode}): "
                + self._stderr.decode(errors="replace")[-2000:]
            )
        return raw.decode().rstrip("\n")

    def kill(self) -> None:
        """SIGKILL: no drain, no lease release, no goodbye."""
        if self.proc.returncode is None:
            self.proc.kill()

    async def close(self) -> int:
        """Kill it if it still runs, and reap it (always called)."""
        self.kill()
        code = await self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await self._drain
        return code
