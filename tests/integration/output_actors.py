"""Actors whose handlers produce whatever a test puts in ``OUTPUTS`` (hardening, issue 10).

Arguments cannot carry what the tests need (NUL, lone surrogates, NaN, ``object()``: they are
refused at admission), so a handler takes a key and looks its output up here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import akter

#: Values handlers produce, by key; set by the tests before the call.
OUTPUTS: dict[str, Any] = {}


class Loose(BaseModel):
    data: Any = None
    text: str = ""
    n: int = 0


class Said(akter.Event):
    data: Any = None
    text: str = ""


class OutputRefused(akter.DeclaredError):
    sku: str = ""
    data: Any = None
    amount: float = 0.0


class Output(akter.Actor[Loose], access=akter.public, delivery_timeout=5):
    """Each command puts ``OUTPUTS[key]`` in one place a turn writes."""

    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n

    @akter.command
    async def reply(self, key: str) -> Any:
        self.state.n += 1
        return OUTPUTS[key]

    @akter.command
    async def reply_float(self, key: str) -> float:
        self.state.n += 1
        return OUTPUTS[key]  # type: ignore[no-any-return]

    @akter.command
    async def reply_text(self, key: str) -> str:
        self.state.n += 1
        return OUTPUTS[key]  # type: ignore[no-any-return]

    @akter.command
    async def store(self, key: str) -> int:
        self.state.data = OUTPUTS[key]
        self.state.n += 1
        return self.state.n

    @akter.command
    async def store_text(self, key: str) -> int:
        self.state.text = OUTPUTS[key]
        self.state.n += 1
        return self.state.n

    @akter.command
    async def say(self, key: str) -> int:
        self.emit(Said(data=OUTPUTS[key]))
        self.state.n += 1
        return self.state.n

    @akter.command
    async def say_text(self, key: str) -> int:
        self.emit(Said(text=OUTPUTS[key]))
        self.state.n += 1
        return self.state.n

    @akter.command(errors=[OutputRefused])
    async def refuse(self, key: str) -> int:
        self.state.n += 1
        raise OutputRefused(data=OUTPUTS[key])

    @akter.command(errors=[OutputRefused])
    async def refuse_sku(self, key: str) -> int:
        self.state.n += 1
        raise OutputRefused(sku=OUTPUTS[key])

    @akter.command(errors=[OutputRefused])
    async def refuse_amount(self, key: str) -> int:
        self.state.n += 1
        raise OutputRefused(amount=OUTPUTS[key])

    @akter.query
    async def peek(self) -> Loose:
        return self.state


class Hasty(
    akter.Actor[Loose],
    access=akter.public,
    execution_timeout=0.4,
    lock_wait=0.2,
    delivery_timeout=2,
):
    """A short execution timeout: a slow commit flight is cancelled while it is in flight."""

    @akter.command
    async def say_text(self, key: str) -> int:
        self.emit(Said(text=OUTPUTS[key]))
        self.state.n += 1
        return self.state.n


ALL = [Output, Hasty]
