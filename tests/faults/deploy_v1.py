"""Version 1 of the rolling-deploy drill's code (``tests.faults.deploy_drill``).

Every command records the token it was called with in its actor's ``tokens``, so the drill's
ledger can tell from the final rows which acknowledged command applied, and how often. The
types, by the drill's case:

- ``Acct`` (add a defaulted field): v2 adds ``note: str = ""``, at the same state version;
- ``Meter`` (rename a field with a migration): v2 renames ``count`` to ``total``, state version 1;
- ``Box`` and ``Feeder`` (a new command with pending intents): v2's ``Feeder.feed`` stages an
  intent to ``Box.put_new``, which v1's ``Box`` does not declare;
- ``Mover`` (a workflow's command step changes its target): v1's ``move`` adds to
  ``Acct/'wx'``, v2's to ``Acct/'wy'``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

import akter


class Tokens(BaseModel):
    tokens: list[str] = []


class MeterState(BaseModel):
    count: int = 0
    tokens: list[str] = []


class Acct(akter.Actor[Tokens], name="Acct", access=akter.public):
    @akter.command
    async def add(self, token: str) -> int:
        if token.startswith("step"):
            # A workflow's step turn takes a while on v1, so the drain that stops v1 finds
            # runs in the middle of their command step (issue 38 finding 3's window).
            await asyncio.sleep(0.05)
        self.state.tokens.append(token)
        return len(self.state.tokens)


class Meter(akter.Actor[MeterState], name="Meter", access=akter.public):
    @akter.command
    async def add(self, token: str) -> int:
        self.state.count += 1
        self.state.tokens.append(token)
        return self.state.count


class Box(akter.Actor[Tokens], name="Box", access=akter.public):
    @akter.command
    async def put(self, token: str) -> int:
        self.state.tokens.append(token)
        return len(self.state.tokens)


class Feeder(akter.Actor[Tokens], name="Feeder", access=akter.public):
    @akter.command
    async def feed(self, token: str) -> None:
        box, _, _ = token.partition(".")
        self.send(Box.put, f"box{box}", token)


class Mover(akter.Actor[akter.EmptyState], name="Mover", access=akter.public):
    @akter.workflow
    async def move(wf: akter.Workflow, token: str) -> str:
        await wf.get(Acct, "wx").add(token)
        return token

    @akter.command
    async def go(self, token: str) -> str:
        return self.start_workflow(Mover.move, token)


CLASSES: dict[str, Any] = {c.__name__: c for c in (Acct, Meter, Box, Feeder, Mover)}
