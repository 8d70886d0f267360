#!/usr/bin/env python3
"""Smoke: sequential warm-turn latency, one flight vs two, over a delay proxy (issue 45).

    python bench/one_flight_latency.py --url URL [--delay-ms 0.5] [--turns 300] [--rounds 2]

The runtime reaches PostgreSQL through a TCP proxy (its own thread and event loop) that holds
every chunk ``--delay-ms`` in each direction, so a round trip costs about twice that more than
on loopback (asyncio's timers round a sleep up to the next millisecond tick: read the injected
round trip as ~1-2 ms). Each round runs ``--turns`` sequential warm turns of one actor (ids minted
for their call) with ``TurnEngine.one_flight`` on, then off, on a fresh schema, and prints each
mode's p50 and p90 in ms. Not a test; figures from a shared machine are a smoke only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel

import akter
from akter._engine.turn.engine import TurnEngine


class Tally(BaseModel):
    n: int = 0


class Bench(akter.Actor[Tally]):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


class DelayProxy:
    """A loopback TCP proxy that delays each chunk by ``delay_s`` in each direction."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        params = conninfo_to_dict(upstream)
        self._host = str(params.get("host") or "127.0.0.1")
        self._port = int(str(params.get("port") or 5432))
        self._upstream = upstream
        self._delay = delay_s
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.url = ""

    def start(self) -> None:
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result()

    async def _listen(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        self.url = make_conninfo(self._upstream, host="127.0.0.1", port=str(port), hostaddr=None)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    writer.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(send())
        while True:
            chunk = await reader.read(65536)
            queue.put_nowait((time.monotonic() + self._delay, chunk))
            if not chunk:
                break
        await sender


async def _timed(call: Callable[[], Awaitable[object]], turns: int) -> list[float]:
    laps: list[float] = []
    for _ in range(turns):
        started = time.perf_counter()
        await call()
        laps.append((time.perf_counter() - started) * 1000)
    return laps


async def _mode(url: str, direct: str, one_flight: bool, turns: int) -> list[float]:
    TurnEngine.one_flight = one_flight
    schema = f"akter_bench_{uuid.uuid4().hex[:10]}"
    runtime = akter.Runtime([Bench], database_url=url, schema=schema)
    await runtime.start()
    try:
        handle = runtime.get(Bench, "one")
        for _ in range(20):  # cold, then warm; every pooled connection prepared
            await handle.add(1)
        return await _timed(lambda: handle.add(1), turns)
    finally:
        await runtime.stop()
        async with await psycopg.AsyncConnection.connect(direct, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _pct(laps: list[float], q: int) -> float:
    return statistics.quantiles(laps, n=100)[q - 1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="PostgreSQL URL")
    parser.add_argument("--delay-ms", type=float, default=0.5, help="delay in each direction")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    proxy = DelayProxy(args.url, args.delay_ms / 1000)
    proxy.start()
    laps: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for one_flight in (True, False):
            laps[one_flight] += await _mode(proxy.url, args.url, one_flight, args.turns)
    for one_flight, name in ((True, "one flight"), (False, "two flights")):
        got = laps[one_flight]
        print(
            f"{name}: {len(got)} turns, p50 {_pct(got, 50):.2f} ms, p90 {_pct(got, 90):.2f} ms"
            f" (delay {args.delay_ms} ms each way)"
        )


if __name__ == "__main__":
    asyncio.run(main())
