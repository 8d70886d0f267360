"""One attempt of a workflow run: the function re-run from the top against its journal.

The attempt is the ``wf`` context's :class:`~akter.workflows.StepDriver`. Each durable await
takes the next ``seq``. A journal record at that seq answers the step without doing anything
(its kind and name must match the code's, else the run *diverged*, W5). Past the journal the
step is performed and recorded, each record guarded by the attempt's token
(:mod:`~akter._engine.workflows.journal`):

- a command or query step (:mod:`~akter._engine.workflows.call_steps`) records its command id,
  target and arguments' hash, and its outcome with the next record;
- a job step (:mod:`~akter._engine.workflows.job_steps`) stages the job row with its
  ``pending`` record in one transaction, then suspends until the job's settle routes its
  outcome to the step (``$workflow.job``);
- a sleep or a signal wait (here) records its wake time as ``pending`` and suspends until then;
- a local step (``wf.step``, here) runs, then records (at least once);
- recorded values (``now``, ``uuid4``, ``random``) and ``patched`` markers (here) are buffered
  and written with the next record, before any effect that could depend on them.

A replayed step is the code's step only when its kind and name match the record's and, where
the record holds them, its target actor and arguments' hash
(:func:`~akter._engine.workflows.journal.args_digest`): any difference parks the run as
*diverged* (W5), naming the seq and both sides. Records written by older code lack the hash (and
a query's its target): what the record holds is compared, nothing more.

Control leaves the user's code through ``BaseException`` subclasses (``except Exception`` in a
workflow cannot swallow them): :class:`Suspend`, :class:`Diverged`, :class:`Outage` and
:class:`LeaseLost` (:mod:`akter._engine.workflows.control`). The executor
(:mod:`akter._engine.workflows.engine`) decides what each means.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from akter import telemetry
from akter._engine.workflows.call_steps import CallSteps
from akter._engine.workflows.control import Fatal, Suspend, durable
from akter._engine.workflows.job_steps import JobSteps
from akter._ids import canonical_json
from akter._kinds import StepKind
from akter._store.gateway.workflows import StepRecord
from akter.errors import StepFailed
from akter.workflows import signal_name

log = logging.getLogger("akter.workflows")


class RunAttempt(CallSteps, JobSteps):
    """One attempt of a claimed run (module docstring): the ``wf`` context's driver."""

    # --- sleeps and waits -------------------------------------------------------------------

    @durable
    async def sleep(self, delay_ms: int | None, until_ms: int | None) -> None:
        """A durable timer: its end recorded as pending, then a suspension until it passes."""
        seq, rec = self._next(StepKind.SLEEP, "sleep")
        if rec is not None and rec.status == "done":
            return
        if rec is not None:
            until = int(json.loads(rec.detail or "{}")["until"])
        else:
            until = until_ms if until_ms is not None else self._now() + (delay_ms or 0)
            if until > self._now():
                detail = canonical_json({"until": until})
                await self._record(StepRecord(seq, StepKind.SLEEP, "sleep", "pending", detail))
        if self._now() >= until:
            self.buffered.append(
                StepRecord(seq, StepKind.SLEEP, "sleep", "done", canonical_json({"until": until}))
            )
            return
        raise Suspend(until, f"sleep until {until}")

    @durable
    async def wait(self, signal: type[BaseModel], timeout_ms: int | None) -> Any:
        """A signal wait: the oldest unconsumed signal of the class, or a suspension."""
        name = signal_name(signal)
        seq, rec = self._next(StepKind.WAIT, name)
        if rec is not None and rec.status == "done":
            payload = json.loads(rec.outcome or "null")["signal"]
            return None if payload is None else signal.model_validate(payload)
        if rec is not None:
            until = json.loads(rec.detail or "{}").get("until")
        else:
            until = None if timeout_ms is None else self._now() + timeout_ms
        rejected: list[tuple[str, int]] = []
        for found in [s for s in self.signals if s.name == name]:
            self.signals.remove(found)
            try:
                value = signal.model_validate_json(found.payload)
            except ValidationError as exc:
                # Set aside (consumed at seq -1), never fatal: a sender's bad payload must not
                # end the run. The journal keeps it for operators.
                log.warning(
                    "Workflow signal does not validate; set aside",
                    extra={"run_id": self.run_id, "signal_id": found.signal_id, "error": str(exc)},
                )
                rejected.append((found.signal_id, -1))
                continue
            outcome = canonical_json({"signal": json.loads(found.payload)})
            await self._record(
                StepRecord(seq, StepKind.WAIT, name, "done", None, outcome),
                consumed=(*rejected, (found.signal_id, seq)),
            )
            return value
        if until is not None and self._now() >= until:
            await self._record(
                StepRecord(
                    seq, StepKind.WAIT, name, "done", None, canonical_json({"signal": None})
                ),
                consumed=tuple(rejected),
            )
            return None
        if rec is None or rejected:
            await self._record(
                StepRecord(seq, StepKind.WAIT, name, "pending", canonical_json({"until": until})),
                consumed=tuple(rejected),
            )
        raise Suspend(until, f"signal {name}")

    # --- local steps, values, markers -------------------------------------------------------

    @durable
    async def step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        attempts: int,
        backoff: tuple[float, float],
    ) -> Any:
        """A local function step: run, then record (at least once)."""
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        adapter = _result_adapter(fn)
        seq, rec = self._next(StepKind.STEP, name)
        if rec is not None:
            outcome = json.loads(rec.outcome or "null")
            if "failed" in outcome:
                failed = outcome["failed"]
                raise StepFailed(name, int(failed["attempts"]), str(failed["cause"]))
            return adapter.validate_python(outcome["ok"])
        await self.flush()  # values its arguments came from are recorded before the call
        with telemetry.workflow_step(StepKind.STEP, name, seq):
            return await self._run_step(seq, name, fn, args, attempts, backoff, adapter)

    async def _run_step(
        self,
        seq: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        attempts: int,
        backoff: tuple[float, float],
        adapter: TypeAdapter[Any],
    ) -> Any:
        started = time.monotonic()
        delay, cause = backoff[0], ""
        for attempt in range(1, attempts + 1):
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn(*args)
                else:
                    value = await asyncio.to_thread(fn, *args)
                    if inspect.isawaitable(value):
                        value = await value
                break
            except Exception as exc:
                cause = f"{type(exc).__name__}: {exc}"
                log.info(
                    "Workflow step attempt failed",
                    extra={"run_id": self.run_id, "step": name, "attempt": attempt},
                )
                if attempt < attempts:
                    await asyncio.sleep(delay)
                    delay = min(backoff[1], max(delay * 2, 0.001))
        else:
            failed = {"failed": {"attempts": attempts, "cause": cause}}
            await self._record(
                StepRecord(seq, StepKind.STEP, name, "done", None, canonical_json(failed))
            )
            raise StepFailed(name, attempts, cause)
        self.services.metrics.observe(
            "akter.workflow.step.duration_ms", (time.monotonic() - started) * 1000
        )
        try:
            dumped = adapter.dump_python(value, mode="json")
        except Exception as exc:
            raise Fatal(f"The result of step {name!r} is not JSON: {exc}") from None
        stored = self._encode({"ok": dumped}, f"step {name!r}")
        await self._record(StepRecord(seq, StepKind.STEP, name, "done", None, stored))
        return adapter.validate_python(json.loads(stored)["ok"])

    def value(self, kind: str, make: Callable[[], Any], adapter: TypeAdapter[Any]) -> Any:
        """A recorded value: the journal's on replay, else made now and buffered."""
        seq, rec = self._next(StepKind.VALUE, kind, durable=False)
        if rec is not None:
            return adapter.validate_python(json.loads(rec.outcome or "null")["ok"])
        value = make()
        stored = canonical_json({"ok": adapter.dump_python(value, mode="json")})
        self.buffered.append(StepRecord(seq, StepKind.VALUE, kind, "done", None, stored))
        return adapter.validate_python(json.loads(stored)["ok"])

    def patched(self, marker: str) -> bool:
        """A version marker (W5): recorded where new code first meets it."""
        rec = self.journal.get(self.seq)
        if rec is None:
            self.buffered.append(StepRecord(self.seq, StepKind.PATCH, marker, "done"))
            self.seq += 1
            return True
        if rec.kind == StepKind.PATCH and rec.name == marker:
            self.seq += 1
            return True
        return False


def _result_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    return TypeAdapter(hints.get("return", Any))


__all__ = ["RunAttempt"]
