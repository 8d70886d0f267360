"""The connection pools: psycopg 3 async, autocommit connections, explicit transactions.

Two pools per runner (README, "Connections"):

- ``pool`` (``Runtime(pool_size=...)``) serves callers: turns and queries. A turn waits at most
  ``pool_wait`` for a connection and a query ``query_pool_wait``; then the caller gets
  ``ActorError`` ``ActorUnavailable`` (code ``pool_exhausted``), never a driver exception.
- ``framework`` (``framework_pool_size``, default 3) serves the framework's own short statements:
  heartbeats, singleton leases, the clock, relay backoffs, job claims, renewals and settles,
  retention sweeps and sampling. User turns never take these connections, so a runner whose
  turns hold every pooled connection still refreshes its leases and heartbeats.

Relay claims and settles and ``LISTEN`` use dedicated connections outside both pools.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool

from akter._store.citus import DROP_IN, Strategy, detect_strategy
from akter._store.pipeline import TurnPipeline
from akter._store.queries import Queries
from akter.errors import ActorError

log = logging.getLogger("akter.store")


class Metrics(Protocol):
    """Where the pools record connection waits (``akter.telemetry.Metrics``)."""

    def observe(self, name: str, value: float) -> None:
        """Record one observation of histogram ``name``."""


Connection = psycopg.AsyncConnection[tuple[object, ...]]


class TurnConnection(psycopg.AsyncConnection[tuple[object, ...]]):
    """A pooled connection that keeps its turns' pipeline (``gateway.actors.turn_pipeline``)."""

    #: The connection's turn pipeline once a turn ran on it: its prepared statements are this
    #: session's.
    turn_pipeline: TurnPipeline | None = None


class _Reach:
    """Whether a pool can reach its server, told from its connection attempts.

    psycopg_pool counts failed connection attempts (``connections_errors``); the pool's
    ``configure`` callback runs after each successful one and records the count then. More
    failures since the last success mean the pool's latest attempts failed.
    """

    def __init__(self) -> None:
        self.pool: _TimedPool | None = None
        self.errors_at_success = 0
        #: Callers were refused ``database_unreachable`` and no connection opened since.
        self.outage = False

    async def configure(self, conn: Connection) -> None:
        # Turns send BEGIN/COMMIT themselves so that both flights are pipelined round trips.
        await conn.set_autocommit(True)
        self.errors_at_success = self.errors()
        if self.outage:
            self.outage = False
            log.info(
                "Database reachable again: pool %s opened a connection; callers are served",
                self.pool.name if self.pool else "?",
                extra={"code": "database_unreachable"},
            )

    def errors(self) -> int:
        return self.pool.get_stats().get("connections_errors", 0) if self.pool else 0

    def failing(self) -> bool:
        """Whether the pool's connection attempts failed since it last opened a connection."""
        return self.errors() > self.errors_at_success


class _TimedPool(AsyncConnectionPool[Connection]):
    """The pool, timing each connection acquisition into ``akter.pool.wait_ms``.

    It also counts the connections it handed out and has not had back (:attr:`handed_out`):
    with the count below ``max_size``, a wait that found no connection was not a full pool.
    """

    metrics: Metrics | None = None
    #: Calls of :meth:`getconn` not yet answered: a connection kept back from the pool (a
    #: mailbox worker's, ``TurnEngine``) goes back as soon as one is waiting.
    getting = 0
    #: Connections handed out by :meth:`getconn` and not yet given back with :meth:`putconn`.
    handed_out = 0
    #: The pool's connection attempts, as far as its reachability goes.
    reach: _Reach | None = None

    def unreachable(self) -> bool:
        """Whether the server, not a full pool, is why a caller got no connection just now.

        The pool had room (fewer than ``max_size`` connections handed out) and its connection
        attempts have failed since its last successful one.
        """
        return self.handed_out < self.max_size and self.reach is not None and self.reach.failing()

    async def getconn(self, timeout: float | None = None) -> Connection:  # noqa: ASYNC109
        started = time.perf_counter()
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        self.getting += 1
        try:
            conn = await super().getconn(timeout)
        finally:
            self.getting -= 1
        self.handed_out += 1
        if task is not None and task.cancelling() > requested:
            # psycopg_pool waits with asyncio.wait_for, which on Python 3.11 drops a cancellation
            # that arrives as a connection is handed over (see akter._waits): a background loop
            # would then never stop. Hand the connection back and deliver the cancellation.
            await asyncio.shield(self.putconn(conn))
            raise asyncio.CancelledError
        if self.metrics is not None:
            self.metrics.observe("akter.pool.wait_ms", (time.perf_counter() - started) * 1000)
        return conn

    async def putconn(self, conn: Connection) -> None:
        """Give a connection back (counted out of :attr:`handed_out`)."""
        self.handed_out -= 1
        await super().putconn(conn)


def _pool(url: str, name: str, size: tuple[int, int], **options: object) -> _TimedPool:
    """A pool of autocommit connections whose reach is recorded (:class:`_Reach`)."""
    reach = _Reach()
    pool = _TimedPool(
        url,
        min_size=size[0],
        max_size=size[1],
        open=False,
        configure=reach.configure,
        name=name,
        timeout=30.0,
        **options,  # type: ignore[arg-type]
    )
    reach.pool = pool
    pool.reach = reach
    return pool


#: The server version from which a turn's transaction is bounded by ``transaction_timeout``.
TRANSACTION_TIMEOUT_SINCE = 170_000


class Store:
    """The runtime's view of PostgreSQL: the callers' pool, the framework's pool, the catalogue."""

    def __init__(
        self,
        url: str,
        schema: str,
        *,
        min_size: int = 2,
        max_size: int = 20,
        framework_size: int = 3,
    ) -> None:
        self.url = url
        self.queries = Queries(schema)
        #: Connections for callers' turns and queries.
        self.pool: _TimedPool = _pool(
            url,
            f"akter-{schema}",
            (min(min_size, max_size), max_size),
            kwargs={"autocommit": True, "prepare_threshold": 2},
            connection_class=TurnConnection,
        )
        #: Connections for the framework's own statements only (module docstring).
        self.framework: _TimedPool = _pool(
            url,
            f"akter-{schema}-framework",
            # All open from the start: no framework call waits a connect.
            (framework_size, framework_size),
            kwargs={"autocommit": True, "prepare_threshold": 2},
        )

        #: ``server_version_num`` of the server (known once open).
        self.server_version = 0
        #: The claim strategy (``akter._store.citus``): ``"citus"`` when the server has Citus.
        self.strategy: Strategy = "plain"

    @property
    def metrics(self) -> Metrics | None:
        """Where connection waits are recorded (``akter.pool.wait_ms``); ``None``: nowhere."""
        return self.pool.metrics

    @metrics.setter
    def metrics(self, metrics: Metrics | None) -> None:
        self.pool.metrics = metrics

    def bind(self, url: str) -> None:
        """Point both pools at the server's URL (known at start: the embedded server's is late)."""
        self.url = url
        self.pool.conninfo = url
        self.framework.conninfo = url

    async def open(self) -> None:
        """Open both pools and wait for their first connections."""
        await self.framework.open(wait=True, timeout=30.0)
        await self.pool.open(wait=True, timeout=30.0)
        async with self.framework.connection() as conn:
            self.server_version = conn.info.server_version
            self.strategy = await detect_strategy(conn, self.queries)
        if self.strategy == "citus":
            self.queries.prefer(DROP_IN)

    async def close(self) -> None:
        """Close both pools."""
        await self.pool.close()
        await self.framework.close()

    @property
    def unreachable(self) -> bool:
        """Whether callers are refused because the database cannot be reached.

        Set by the first ``database_unreachable`` refusal (:meth:`exhausted`); cleared when the
        callers' pool opens a connection again.
        """
        return self.pool.reach is not None and self.pool.reach.outage

    def exhausted(self, wait_s: float, what: str, command_id: str | None = None) -> ActorError:
        """The refusal of a caller that got no pooled connection within ``wait_s`` seconds.

        ``database_unreachable`` when the pool had room but its connection attempts fail (the
        server is down, restarting, or out of reach), else ``pool_exhausted``. Both are
        retryable: nothing ran.
        """
        if self.pool.unreachable():
            return self._unreachable(wait_s, what, command_id)
        return ActorError(
            "ActorUnavailable",
            f"No database connection for {what} within {wait_s:g} s: all {self.pool.max_size} "
            "pooled connections of this runner are busy (pool_size). Nothing ran; retry after "
            "retry_after, with the same command id for a command.",
            code="pool_exhausted",
            retry_after=0.5 * random.uniform(0.8, 1.2),
            command_id=command_id,
        )

    def _unreachable(self, wait_s: float, what: str, command_id: str | None) -> ActorError:
        error = ActorError(
            "ActorUnavailable",
            f"No database connection for {what} within {wait_s:g} s: the database cannot be "
            f"reached (this runner's connection attempts to it fail; only "
            f"{self.pool.handed_out} of {self.pool.max_size} pooled connections are in use). "
            "Nothing ran; retry after retry_after, with the same command id for a command, "
            "and check that PostgreSQL is up and reachable from this runner.",
            code="database_unreachable",
            retry_after=1.0 * random.uniform(0.8, 1.2),
            command_id=command_id,
        )
        reach = self.pool.reach
        if reach is not None and not reach.outage:
            # One line per outage, not one per refused caller.
            reach.outage = True
            log.warning(
                "Database unreachable (database_unreachable): callers are refused until this "
                "runner connects to PostgreSQL again; the first refused was %s",
                what,
                extra={"pool": self.pool.name, "code": "database_unreachable"},
            )
        return error

    async def connect_direct(self) -> Connection:
        """A dedicated connection outside the pool (migrations, LISTEN)."""
        return await psycopg.AsyncConnection.connect(self.url, autocommit=True)


#: Slack beyond a row's longest possible lead before it counts as skewed (see ``Clock.skew_ms``).
SKEW_MARGIN_MS = 2_000
#: The skew bound while a test clock jump is under way: nothing counts as skewed.
_NO_SKEW_CHECK_MS = 1 << 62


class Clock:
    """The framework clock (semantics §1.7): database time in ms plus a test offset.

    ``read()`` asks the database. ``estimate()`` gives a lower bound of the database clock from
    the last sample without a round trip (used to mint command ids, where a value slightly in
    the past is harmless and one in the future would be refused as ``future``).

    Clock skew. Every lease-like row is written from the clock at the moment of writing, so on a
    correct clock it is never further ahead of "now" than the longest lead its writer gives it:

    - a singleton lease (``lease_until_ms``): now + ``singleton_lease`` at each acquire/refresh;
    - a runner heartbeat (``heartbeat_at_ms``): now, at each register/heartbeat (lead 0);
    - a job attempt lease (running job row's ``due_at_ms``): now + the executor ``lease`` at the
      claim, ``greatest(due, now + lease)`` at each renewal;
    - a relay claim (intent row with ``attempts > 0``): now + max(``claim_lease``, backoff) at
      the claim, now + backoff (≤ ``max_backoff``) after a failure, now at a release.
      Intent rows with ``attempts = 0`` carry due times chosen by handlers (timers, ticks) and
      may lie arbitrarily far ahead: they are never taken as skewed.

    A row further ahead than twice its lead + ``SKEW_MARGIN_MS`` was written before the database
    clock moved back (NTP step, failover to a host with another clock; ``clock_offset`` in
    drills). Left alone it would stall a takeover for the whole jump, so the claim and takeover
    statements treat it as ended (with a warning that names the skew). Twice: runners should
    share ``singleton_lease``, the executor ``lease`` and the relay leases, but one configured
    with up to twice another's (or a drill runner set a lease ahead) must not lose its live
    rows. So a jump is absorbed within at most three leads + 2 s, instead of its whole length.
    ``skew_ms(lead)`` is the bound the statements are given.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self.offset_ms = 0
        #: Set by ``ActorTest.advance`` while it moves leases and offsets one runtime at a
        #: time: between the two, a lease moved ahead must not read as skewed.
        self.jumping = False
        self._base_db_ms = 0
        self._base_mono = 0.0
        self._sampled = False

    async def read(self) -> int:
        """One database round trip (a framework connection): the framework clock now."""
        async with self._store.framework.connection() as conn:
            return await self.read_on(conn)

    async def read_on(self, conn: Connection) -> int:
        """Read the framework clock on a given connection, and refresh the estimate."""
        cur = await conn.execute(self._store.queries["clock_now"], {"off": self.offset_ms})
        row = await cur.fetchone()
        assert row is not None
        now = int(row[0])  # type: ignore[call-overload]
        after = time.monotonic()
        # The database read happened before `after`: anchoring `now` there keeps the estimate
        # a lower bound of the real clock.
        self._base_db_ms = now - self.offset_ms
        self._base_mono = after
        self._sampled = True
        return int(now)

    def observe(self, now_ms: int) -> None:
        """Refresh the estimate from a clock value a statement just returned."""
        self._base_db_ms = now_ms - self.offset_ms
        self._base_mono = time.monotonic()
        self._sampled = True

    def estimate(self) -> int:
        """A lower bound of the framework clock from the last sample (no round trip)."""
        if not self._sampled:
            raise RuntimeError("The clock has not been sampled yet; start the runtime first.")
        elapsed = int((time.monotonic() - self._base_mono) * 1000)
        return self._base_db_ms + elapsed + self.offset_ms

    def skew_ms(self, lead_ms: int) -> int:
        """How far ahead of now a row its writer leads by at most ``lead_ms`` may lie, unskewed."""
        if self.jumping:
            return _NO_SKEW_CHECK_MS
        return 2 * lead_ms + SKEW_MARGIN_MS
