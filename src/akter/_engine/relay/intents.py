"""The intent lane: claims due outbox rows and delivers them as commands (semantics §3).

Correctness rests on polling with a due-time index, claims leased through ``due_at_ms`` and
settles guarded by the claim token. The pass loop (``akter._engine.loop.passes``) decides when a
pass runs; each pass calls :meth:`Relay.claim`, which claims intents up to the free delivery
slots in one statement. Each claimed intent is delivered by its own task with the intent id as
command id; the receiver's receipt turns a redelivery into a replay.

Keeping the lane full under load (docs/benchmarks.md, relay finding 2):

- every delivery that ends while the last claim took all the rows it asked for wakes the pass
  loop, so slots freed while a claim is in flight are refilled by the pass right after it;
- claims and settles run on two connections of the relay's own, not the pool's: under load the
  pool's callers kept a claim or a settle waiting for a connection longer than the statement
  took, and a settle never waits behind a claim;
- deliveries that end together are deleted by one statement (a group commit); a delivery whose
  receiver committed frees its slot while its delete is under way (its row is delivered, not
  waiting), so the lane's slots hold receiver turns. At most a lane's worth of rows wait for
  their delete this way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from akter import telemetry
from akter._engine import parking, ticks
from akter._engine.lanes import Claimed, Deliver, Pass, Waker
from akter._kinds import TRANSACTION_SOURCE, CronTick, WorkflowIntent, decode_intent
from akter._store.gateway.jobs import JobKey
from akter._store.gateway.outbox import ClaimedIntent, IntentClaim, IntentKey, OutboxGateway
from akter.callers import ActorRef, caller_from_json
from akter.errors import ActorError, InjectedCrash

if TYPE_CHECKING:
    from akter._engine.hooks import HookInfo
    from akter._engine.services import Services

log = logging.getLogger("akter.relay")


@dataclass
class _Claim:
    row: ClaimedIntent
    token: int
    dispatched: bool = False
    settling: bool = False  # the receiver committed; only the delete is left (slot freed)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkflowIntents(Protocol):
    """Takes the ``$workflow.*`` intents, staged for the workflow engine, not an actor."""

    def deliver(
        self, ref: ActorRef, command: str, payload: str, intent_id: str, caller: str
    ) -> Awaitable[None]: ...


class Passes(Protocol):
    """Runs one pass of every lane (the pass loop's ``run_pass``)."""

    def run_pass(self, *, drain: bool = False) -> Awaitable[int]: ...


#: Whether a live runner's code declares a command (``Runners.declares_command``).
DeclaredElsewhere = Callable[[str, str], Awaitable[bool]]


class Relay:
    """Claims and delivers intents and timers for one runner (module docstring).

    Args:
        services: The runner's services.
        outbox: The outbox gateway (its claim and settle connections; closed by :meth:`stop`).
        deliver: Runs one claimed intent as an internal command (``Runtime.deliver``).
        waker: The pass loop's wakes: a freed slot asks for a pass; released claims announce.
        passes: The pass loop itself (:meth:`run_pass` runs one pass of every lane).
        workflows: Takes the ``$workflow.*`` intents instead of an actor.
        declared_elsewhere: Whether a live runner's code declares a command: an intent to a
            command this code lacks is left due for that runner, not parked (a rolling deploy).
    """

    def __init__(
        self,
        services: Services,
        *,
        outbox: OutboxGateway,
        deliver: Deliver,
        waker: Waker,
        passes: Passes,
        workflows: WorkflowIntents | None = None,
        declared_elsewhere: DeclaredElsewhere | None = None,
    ) -> None:
        self._services = services
        self._outbox = outbox
        self._deliver_command = deliver
        self._waker = waker
        self._passes = passes
        self._workflows = workflows
        self._declared_elsewhere = declared_elsewhere
        self._claims: dict[tuple[int, str], _Claim] = {}
        self._widen = 1
        self._left_candidates = False
        self._stopping = False
        # Settles waiting for the next group statement, each with the future its delivery awaits
        # (resolved with None, or with the error the statement raised).
        self._settles: list[tuple[IntentClaim, asyncio.Future[BaseException | None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.delivered = 0
        self.retried = 0
        self._released = 0
        self._too_new_log = parking.OncePer(3600)

    # --- lifecycle --------------------------------------------------------------------------

    async def stop(self, deadline: float) -> int:
        """Stop claiming; let dispatched deliveries finish until ``deadline``; release the rest.

        The pass loop has stopped first. Returns how many claims were released.
        """
        self._stopping = True
        # Claims whose turn has not been dispatched are handed back at once; dispatched ones may
        # finish (their turn is running) until the deadline.
        for claim in list(self._claims.values()):
            if not claim.dispatched and claim.task is not None:
                claim.task.cancel()
        pending = [c.task for c in self._claims.values() if c.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        leftovers = [c for c in self._claims.values() if c.task is not None and not c.task.done()]
        for claim in leftovers:
            assert claim.task is not None
            claim.task.cancel()
        await asyncio.gather(*(c.task for c in leftovers if c.task), return_exceptions=True)
        if self._flusher is not None:
            # A settle statement already sent finishes (its deliveries may be gone by now).
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self._released:
            # The released rows are due now; idle runners may sleep until their next due row.
            await self._waker.announce()
        await self._outbox.close()
        return self._released

    # The pass loop's wakes and passes, as tests and operators reach them through the relay.

    def wake(self) -> None:
        """Ask the pass loop for a pass soon (capacity one: repeated wakes coalesce)."""
        self._waker.wake()

    def wake_jobs(self, keys: Sequence[JobKey] = ()) -> None:
        """Ask the pass loop for a pass soon that need only claim jobs (``Waker.wake_jobs``)."""
        self._waker.wake_jobs(keys)

    async def announce(self) -> None:
        """After an operator made rows due now: a pass here, and every runner woken."""
        await self._waker.announce()

    def poke_others(self) -> None:
        """After a local commit with ``notify=True``: NOTIFY other runners, at most every 50 ms."""
        self._waker.poke_others()

    async def run_pass(self, *, drain: bool = False) -> int:
        """One pass of the pass loop over every lane; how many rows the lanes claimed.

        A test drain (``drain=True``) may fill up to ``pass_limit`` delivery slots at once, so
        a backlog of thousands settles within the drain's round limit.
        """
        return await self._passes.run_pass(drain=drain)

    # --- passes -----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Intent deliveries running on this runner."""
        return len(self._claims)

    async def wait_idle(self) -> None:
        """Await every delivery started so far."""
        while True:
            tasks = [c.task for c in self._claims.values() if c.task is not None]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def claim(self, p: Pass) -> Claimed:
        """A pass's claim (``akter._engine.lanes.Lane``): intents into free delivery slots.

        Nothing when the pass is quiet (nothing due) or for jobs only; ``backlogged`` when the
        last claim took every row it asked for.
        """
        if self._stopping:
            return Claimed()
        if p.quiet:
            self._left_candidates = False
            return Claimed()
        rows = 0 if p.jobs_only else await self._claim_intents(p.drain, p.intent_keys)
        return Claimed(rows, self._left_candidates)

    async def _claim_intents(
        self, drain: bool = False, keys: Sequence[IntentKey] | None = None
    ) -> int:
        config = self._services.config
        types = sorted(self._services.registry.definitions) if config.host_actors else []
        lane = (
            max(config.delivery_concurrency, config.pass_limit)
            if drain
            else (config.delivery_concurrency)
        )
        delivering = sum(1 for c in self._claims.values() if not c.settling)
        settling = len(self._claims) - delivering
        # A delivered row waiting for its delete frees its slot, up to a lane's worth of them:
        # deletes that stall (a lock, an outage) then stop the lane instead of piling up.
        free = min(lane - delivering - max(0, settling - lane), config.pass_limit)
        if not types or free <= 0:
            if types and self._outbox.claims_by_key:
                # Citus: due rows may wait for this full lane (named ones are not kept), so
                # the next freed slot asks for a pass, which scans.
                self._left_candidates = True
            return 0
        if keys is not None and self._outbox.claims_by_key and not self._left_candidates:
            rows = await self._claim_keyed(keys, set(types), free)
        else:
            rows = await self._claim_scanned(types, free)
        for row in rows:
            claim = _Claim(row, row.claimed_until)
            key = (row.routing_key, row.intent_id)
            self._claims[key] = claim
            claim.task = asyncio.create_task(
                self._deliver(key, claim), name=f"akter.relay.deliver {row.intent_id}"
            )
        return len(rows)

    async def _claim_scanned(self, types: list[str], free: int) -> list[ClaimedIntent]:
        """Claim up to ``free`` due intents of ``types``, oldest first (the full claim)."""
        config = self._services.config
        rows = await self._outbox.claim(
            types=types,
            probe=2 * free * self._widen,
            free=free,
            lease_ms=config.claim_lease_ms,
            max_backoff_ms=config.max_backoff_ms,
        )
        candidates = rows[0].candidates if rows else 0
        if len(rows) < free and candidates > len(rows):
            self._widen = min(64, self._widen * 2)
        else:
            self._widen = 1
        if self._outbox.claims_by_key:
            # Citus: left behind only when the scan saw more due rows than it took (its probe
            # reads twice the free slots). A claim that filled the slots with every due row
            # would otherwise make each freed slot ask for another scan of every shard, and
            # keep the next commits' intents from being claimed by key.
            self._left_candidates = candidates > len(rows)
        else:
            self._left_candidates = len(rows) == free
        return rows

    async def _claim_keyed(
        self, keys: Sequence[IntentKey], types: set[str], free: int
    ) -> list[ClaimedIntent]:
        """Claim the intents local commits named, up to ``free``, without a scan (Citus).

        Only after a claim that left no candidate behind: a backlog is claimed oldest first
        by the scan. Keys past ``free`` are left to the scan that the freed slots ask for.
        """
        config = self._services.config
        hosted = [
            k
            for k in keys
            if k.target_type in types and (k.routing_key, k.intent_id) not in self._claims
        ]
        rows = await self._outbox.claim_keyed(
            hosted[:free], lease_ms=config.claim_lease_ms, max_backoff_ms=config.max_backoff_ms
        )
        self._left_candidates = len(hosted) > free
        return rows

    async def _deliver(self, key: tuple[int, str], claim: _Claim) -> None:
        params = IntentClaim(key[0], key[1], claim.token)
        span, token = telemetry.start_delivery(claim.row)
        try:
            await self._deliver_claimed(params, claim)
        except InjectedCrash:
            # Abandoned like a process death: the claim stays until its lease ends.
            return
        except (psycopg.Error, OSError) as exc:
            # The settle or backoff write failed (an outage): the claim stays until its lease
            # ends and the redelivery replays the receiver's receipt.
            log.warning(
                "Outbox settle failed; the claim expires and redelivery replays: intent %r: %s",
                key[1],
                exc,
                extra={"intent_id": key[1], "error": str(exc)},
            )
        except asyncio.CancelledError:
            await asyncio.shield(self._release(params))
            raise
        finally:
            telemetry.end_delivery(span, token)
            self._claims.pop(key, None)
            self._slot_freed()

    async def _deliver_claimed(self, params: IntentClaim, claim: _Claim) -> None:
        """Deliver one claimed row, then delete it, rewrite its tick, back it off or park it."""
        row = claim.row
        ref = ActorRef(row.tenant_id, row.target_type, row.target_id)
        info = {"ref": ref, "intent_id": params.intent_id, "command": row.command}
        await self._services.hooks.at("after_claim", info)
        entry = None
        try:
            caller = caller_from_json(row.caller)
            definition = self._services.registry.definition(ref.type)
            command = row.command
            target = decode_intent(command, row.timer_key)
            if self._workflows is not None and isinstance(target, WorkflowIntent):
                # Staged by a turn or a job settle for the workflow engine, not an actor.
                claim.dispatched = True
                await self._workflows.deliver(
                    ref, command, row.payload, params.intent_id, row.caller
                )
                await self._settle(params)
                self.delivered += 1
                return
            if isinstance(target, CronTick):
                entry = next((e for e in definition.schedules if e.key == target.key), None)
                if not await self._tick_due(params, row, definition, entry):
                    return
                assert entry is not None
                command = entry.command
            decoded = parking.decode_intent(definition, command, row.payload, row.payload_version)
            if not isinstance(decoded, parking.Decoded):
                await self._undeliverable(params, row, info, decoded)
                return
            claim.dispatched = True
            result = await self._deliver_command(
                ref,
                decoded.name,
                decoded.payload,
                params.intent_id,
                caller,
                within=definition.policy.delivery_timeout / 1000,
                first=_first_delivery(row),
            )
        except (ValueError, TypeError, KeyError) as exc:
            await self._backoff(params, row, f"Undecodable row: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # unknown type or command, invalid payload ...
            await self._backoff(params, row, f"{type(exc).__name__}: {exc}")
            return
        if result.kind == "error":
            await self._refused(params, row, info, result.error)
            return
        await self._services.hooks.at("before_outbox_delete", info)
        # Delivered: the slot goes to the next claim while the row is deleted or rewritten.
        claim.settling = True
        self._slot_freed()
        if entry is not None:
            # After the turn: its admission refreshed the clock estimate (a lower bound of
            # the database clock, no round trip); the claim's clock keeps it ≥ the tick's
            # scheduled time, so the next fire is strictly later than this one.
            now = max(row.now, self._services.clock.estimate())
            await self._next_tick(params, entry, now, decoded.version)
        else:
            await self._settle(params)
        self.delivered += 1
        self._services.metrics.count("akter.relay.delivered", kind="intent")

    def _slot_freed(self) -> None:
        """A slot is free: ask for a pass if the last claim took all the rows it asked for.

        Every freed slot asks (not only the first after a claim), so slots freed while a claim
        is in flight are refilled by the pass right after it.
        """
        if self._left_candidates and not self._stopping:
            self._waker.wake()

    async def _tick_due(
        self, params: IntentClaim, row: ClaimedIntent, definition: Any, entry: Any
    ) -> bool:
        """Decide a claimed schedule tick (semantics §4.5): deliver it, or not.

        Its age is measured at the claim statement's clock (no extra round trip).
        """
        now = row.now
        age = now - row.scheduled_at_ms
        match ticks.decide(age, definition.policy.max_schedule_lag, entry is not None):
            case "fire":
                return True
            case "drop":
                await self._settle(params)
            case "defer":
                # An entry this code no longer declares: a newer runner may own it while young.
                await self._backoff(params, row, "Schedule entry not declared by this runner")
            case "skip":
                log.info(
                    "Schedule tick skipped: older than max_schedule_lag",
                    extra={"actor": row.target_type, "entry": entry.key, "age_ms": age},
                )
                await self._next_tick(params, entry, now, _tick_version(definition, entry))
        return False

    async def _next_tick(
        self, params: IntentClaim, entry: Any, now: int, payload_version: int
    ) -> None:
        """Rewrite a settled tick into the next one: first fire strictly after ``now``, new id.

        ``now`` is a framework clock value at or after the tick's scheduled time that costs no
        round trip: the claim statement's clock, or the estimate the turn just refreshed.
        """
        new_id, due = ticks.next_tick(entry, now, self._services.config.window_ms)
        await self._outbox.rewrite_tick(
            params, new_id=new_id, due=due, payload_version=payload_version
        )

    async def _refused(
        self,
        params: IntentClaim,
        row: ClaimedIntent,
        info: HookInfo,
        error: BaseException | None,
    ) -> None:
        """The receiver refused the delivery: back off, or leave it for a newer runner."""
        reason = getattr(error, "reason", type(error).__name__)
        if reason == "StateTooNew":
            # The receiver's state is newer than this code (a rolling deploy): a newer runner
            # can deliver it, so no attempt is counted (evolution E4).
            await self._undeliverable(params, row, info, parking.TooNew(f"StateTooNew: {error}"))
            return
        await self._backoff(params, row, f"{reason}: {error}")

    async def _undeliverable(
        self,
        params: IntentClaim,
        row: ClaimedIntent,
        info: HookInfo,
        outcome: parking.TooNew | parking.Unusable,
    ) -> None:
        """A row this code cannot deliver: leave it to a newer runner, or park it (E3)."""
        target = f"{row.target_type}.{row.command}"
        if (
            isinstance(outcome, parking.Unusable)
            and outcome.unknown_command
            and self._declared_elsewhere is not None
            and await self._declared_elsewhere(row.target_type, row.command)
        ):
            # A deploy added the command and its runner is live (evolution E4): leave it due
            # for that runner, no attempt counted, as a payload version above this code's.
            outcome = parking.TooNew(f"CommandTooNew: {outcome.cause}")
        if isinstance(outcome, parking.TooNew):
            await self._outbox.release_uncounted(
                params,
                wait_ms=parking.TOO_NEW_WAIT_MS,
                error=(
                    outcome.message
                    if outcome.message.startswith(("StateTooNew", "CommandTooNew"))
                    else f"PayloadTooNew: {outcome.message}"
                ),
            )
            if self._too_new_log.allow(target, row.payload_version):
                log.warning(
                    "Outbox row newer than this code (payload or receiver state); left for a "
                    "newer runner: intent %r to %s, payload version %s",
                    params.intent_id,
                    target,
                    row.payload_version,
                    extra={
                        "intent_id": params.intent_id,
                        "target": target,
                        "payload_version": row.payload_version,
                    },
                )
            return
        await self._services.hooks.at("before_park", info)
        if await self._outbox.park(params, error=outcome.cause[:2000]):
            log.warning(
                "Outbox row parked: this code cannot deliver it: intent %r to %s/%r.%s: %s",
                params.intent_id,
                row.target_type,
                row.target_id,
                row.command,
                outcome.cause,
                extra={"intent_id": params.intent_id, "target": target, "reason": outcome.cause},
            )

    async def _backoff(self, params: IntentClaim, row: ClaimedIntent, error: str) -> None:
        if self._stopping:
            await self._release(params)
            return
        await self._outbox.backoff(
            params, max_backoff_ms=self._services.config.max_backoff_ms, error=error[:2000]
        )
        self.retried += 1
        self._services.metrics.count("akter.relay.retried", kind="intent")
        telemetry.delivery_failed(error)
        log.warning(
            "Outbox delivery failed; retrying with backoff: intent %r to %s/%r.%s, attempt %s: %s",
            params.intent_id,
            row.target_type,
            row.target_id,
            row.command,
            row.attempts,
            error,
            extra={
                "intent_id": params.intent_id,
                "target": f"{row.target_type}/{row.target_id}",
                "command": row.command,
                "attempts": row.attempts,
                "reason": error,
            },
        )

    # --- batched settles -------------------------------------------------------------------

    async def _settle(self, params: IntentClaim) -> None:
        """Delete one delivered intent under its claim token, in the next group statement.

        Raises what that statement raised (an outage: the claim then stays until its lease ends).
        """
        done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._settles.append((params, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_settles(), name="akter.relay.settle")
        # Shielded: a delivery cancelled while it waits leaves the statement to its other rows.
        error = await asyncio.shield(done)
        if error is not None:
            raise error

    async def _flush_settles(self) -> None:
        """Send the waiting settles, one statement per batch, until none waits."""
        while self._settles:
            batch, self._settles = self._settles, []
            error: BaseException | None = None
            try:
                await self._outbox.settle([p for p, _ in batch])
            except asyncio.CancelledError as exc:
                # Not known to be deleted: the waiting deliveries release their claims.
                error = exc
                raise
            except Exception as exc:  # an outage (or a bug): each delivery handles it as its own
                error = exc
            finally:
                for _, done in batch:
                    if not done.done():
                        done.set_result(error)

    async def _release(self, params: IntentClaim) -> None:
        try:
            await self._outbox.release(params)
            self._released += 1
        except (psycopg.Error, OSError) as exc:
            log.warning("Releasing an intent claim failed", extra={"error": str(exc)})


def _first_delivery(row: ClaimedIntent) -> bool:
    """Whether this claim is the first attempt at an intent a turn or a job's settle wrote.

    Its turn may then take the one flight (``Request.first_delivery``): no earlier attempt, so
    only a redelivery racing this one could have committed its id, which the flight's guard
    probes. A timer's row (rewritten per fire), a command staged in the application's own
    transaction (its id may be pinned by the application) and every redelivery take two.
    """
    return row.attempts == 1 and row.timer_key is None and row.actor_type != TRANSACTION_SOURCE


def _tick_version(definition: Any, entry: Any) -> int:
    """The payload version of a tick's command under this code (0 when it is unknown)."""
    try:
        return int(definition.member(entry.command, "command").version)
    except ActorError:
        return 0
