"""Version 2 of the rolling-deploy drill's code: each change of ``deploy_v1``'s docstring."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import akter


class Tokens(BaseModel):
    tokens: list[str] = []


class NotedTokens(BaseModel):
    tokens: list[str] = []
    note: str = ""  # (a): added with a default, no migration, the same state version


class MeterState(BaseModel):
    total: int = 0  # (b): renamed from ``count``
    tokens: list[str] = []


class Acct(akter.Actor[NotedTokens], name="Acct", access=akter.public):
    @akter.command
    async def add(self, token: str) -> int:
        self.state.tokens.append(token)
        self.state.note = token
        return len(self.state.tokens)


class Meter(akter.Actor[MeterState], name="Meter", access=akter.public):
    @akter.migrate_state(from_version=0)
    def _rename(old: dict[str, Any]) -> dict[str, Any]:
        return {"total": old.pop("count", 0), **old}

    @akter.command
    async def add(self, token: str) -> int:
        self.state.total += 1
        self.state.tokens.append(token)
        return self.state.total


class Box(akter.Actor[Tokens], name="Box", access=akter.public):
    @akter.command
    async def put(self, token: str) -> int:
        self.state.tokens.append(token)
        return len(self.state.tokens)

    @akter.command
    async def put_new(self, token: str) -> int:  # (c): a command v1 does not know
        self.state.tokens.append(token)
        return len(self.state.tokens)


class Feeder(akter.Actor[Tokens], name="Feeder", access=akter.public):
    @akter.command
    async def feed(self, token: str) -> None:
        box, _, _ = token.partition(".")
        self.send(Box.put_new, f"box{box}", token)


class Mover(akter.Actor[akter.EmptyState], name="Mover", access=akter.public):
    @akter.workflow
    async def move(wf: akter.Workflow, token: str) -> str:
        await wf.get(Acct, "wy").add(token)  # (d): the step's target changed
        return token

    @akter.command
    async def go(self, token: str) -> str:
        return self.start_workflow(Mover.move, token)


CLASSES: dict[str, Any] = {c.__name__: c for c in (Acct, Meter, Box, Feeder, Mover)}
