"""The app's actor: plain akter declarations, nothing Django-specific."""

from __future__ import annotations

from pydantic import BaseModel

import akter


class Funds(BaseModel):
    cents: int = 0


class Account(akter.Actor[Funds], access=akter.public):
    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @akter.query
    async def balance(self) -> int:
        return self.state.cents
