"""Synchronous Python: ``akter.SyncRuntime`` drives an ``akter.Runtime`` from blocking code.

Django and Flask views, gunicorn sync workers, scripts and notebooks call actors through a
:class:`SyncRuntime`: the same runtime, its event loop running in a background thread the
``SyncRuntime`` owns. Each blocking call hands a coroutine to that loop (in a copy of the calling
thread's context, so ``akter.as_caller`` and tracing scopes carry over) and waits for its result;
the exception it raises is the one the async API raises (``akter.ActorError``, declared errors,
``TimeoutError``). Calls are safe from any number of threads; a forked child, a stopped runtime
and a thread that runs an event loop are refused with a :class:`SyncRuntimeError` naming why.

Typing: a handle's methods cannot be re-typed as blocking (Python's types cannot map a class's
methods), so a blocking handle takes the member as its argument, checked by ParamSpec:
``rt.get(Account, "a-1").call(Account.deposit, cents=5)`` is an ``int`` where ``deposit``
returns one, and a wrong argument is a type error in mypy and pyright. ``rt.run(awaitable)``
runs anything the async API offers (``rt.run(runtime.get(Account, "a-1").deposit(cents=5))``).
See docs/guides/sync.md.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import os
import signal
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, Unpack, cast

from pydantic import BaseModel

from akter._bridge import spawn
from akter._config import RuntimeOptions
from akter._drain import DrainReport
from akter._ids import uuid7
from akter.actor import Actor, ActorDefinition
from akter.callers import ActorRef
from akter.errors import ConfigurationError, invalid_input
from akter.events import EventRecord
from akter.resources import Resources
from akter.runtime import Runtime
from akter.workflows import WorkflowMember, WorkflowRun, WorkflowStatus

__all__ = ["SyncHandle", "SyncRuntime", "SyncRuntimeError", "SyncWorkflowRun"]

#: The longest a waiting call blocks between two looks at Python's pending signals: a SIGINT that
#: another thread of the process received runs its handler (KeyboardInterrupt) within this.
SIGNAL_POLL_S = 0.2

A = TypeVar("A", bound=Actor[Any])
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

SyncRefusal = Literal["not_started", "stopped", "forked", "event_loop"]


class SyncRuntimeError(ConfigurationError):
    """A :class:`SyncRuntime` cannot take this call; ``reason`` says why.

    A ``ConfigurationError``, as the async runtime's refusal before ``start()`` is.

    Attributes:
        reason: ``not_started`` (call ``start()`` or use ``with``), ``stopped`` (it was stopped,
            or stopped while the call waited), ``forked`` (this process is a fork of the one
            that started it: start a runtime of its own), ``event_loop`` (the calling thread
            runs an event loop: ``await`` the async API there instead).
    """

    def __init__(self, reason: SyncRefusal, message: str) -> None:
        super().__init__(message)
        self.reason: SyncRefusal = reason


class SyncRuntime:
    """An :class:`akter.Runtime` driven from synchronous code (docs/guides/sync.md).

    ``SyncRuntime(actors=[...], **options)`` takes :class:`akter.Runtime`'s arguments and
    builds one; :meth:`wrap` drives an existing one. Its loop runs in a daemon thread it
    starts in :meth:`start` and ends in :meth:`stop` (a drain, as ``await runtime.stop()``)::

        with akter.SyncRuntime(actors=[Account]) as rt:
            balance = rt.get(Account, "a-1").call(Account.deposit, cents=500)

    One ``SyncRuntime`` serves every thread of a process. It belongs to the process that
    started it: a forked child (gunicorn ``--preload``) is refused (``reason="forked"``) and
    must start its own. One left running at interpreter exit is stopped by an ``atexit`` hook.

    Attributes:
        runtime: The async runtime it drives (its operator objects, config, metrics).
    """

    def __init__(
        self,
        actors: Sequence[type[Actor[Any]]] = (),
        *,
        resources: Resources | None = None,
        **options: Unpack[RuntimeOptions],
    ) -> None:
        self.runtime = Runtime(actors, resources=resources, **options)
        self._init()

    @classmethod
    def wrap(cls, runtime: Runtime) -> SyncRuntime:
        """Drive ``runtime`` (built, not started) from synchronous code.

        Raises:
            ConfigurationError: ``runtime`` is already started (its tasks run on another loop).
        """
        if runtime.running:
            raise ConfigurationError(
                "SyncRuntime.wrap() takes a runtime that is not started: its SyncRuntime starts "
                "it on the loop thread it owns."
            )
        self = cls.__new__(cls)
        self.runtime = runtime
        self._init()
        return self

    def _init(self) -> None:
        self._lock = threading.Lock()
        self._state: Literal["new", "running", "stopped"] = "new"
        self._pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        #: Futures of calls handed to the loop and not yet settled (cancelled if it ends).
        self._waiting: set[concurrent.futures.Future[Any]] = set()
        self._waiting_lock = threading.Lock()  # not _lock: start() holds that while it waits
        self._drained: concurrent.futures.Future[DrainReport] = concurrent.futures.Future()
        #: How the drain of :meth:`stop` ended (``None`` before it).
        self.last_drain: DrainReport | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> SyncRuntime:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the loop thread and the runtime in it (connect, migrate, background work).

        Returns once the runtime is ready; raises what ``await runtime.start()`` raises.

        Raises:
            SyncRuntimeError: ``stopped`` (a stopped SyncRuntime does not start again) or
                ``forked``.
        """
        with self._lock:
            if self._state == "running":
                self._check_process()
                return
            if self._state == "stopped":
                raise SyncRuntimeError(
                    "stopped", "This SyncRuntime was stopped; build a new one to start again."
                )
            self._refuse_event_loop("start")
            self._pid = os.getpid()  # built before a fork, started after it: this process's
            started: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._thread = threading.Thread(
                target=self._serve, args=(started,), name="akter-sync-runtime", daemon=True
            )
            self._thread.start()
            try:
                started.result()
            except BaseException:
                self._request_stop()
                self._thread.join()
                self._state = "stopped"
                raise
            self._state = "running"
        atexit.register(self._stop_at_exit)

    def stop(self) -> DrainReport:
        """Drain and stop: as ``await runtime.stop()``, then end the loop thread.

        Calls still waiting when the drain ends raise ``SyncRuntimeError("stopped")``.
        Idempotent: a later (or concurrent) call waits for the same drain and returns its report.

        Raises:
            SyncRuntimeError: ``forked`` in a forked child (the parent's runtime is not its
                own to stop); ``event_loop`` from the loop thread itself.
        """
        with self._lock:
            state = self._state
            if state == "new":
                self._state = "stopped"
                return DrainReport("clean")
            self._check_process()
            self._refuse_event_loop("stop")
            self._state = "stopped"
        if state == "running":
            atexit.unregister(self._stop_at_exit)
            self._request_stop()
        if self._thread is not None:
            self._thread.join()
        if state == "running":
            self.last_drain = self._drained.result()
        elif self._drained.done() and self._drained.exception() is None:
            return self._drained.result()
        return self.last_drain or DrainReport("clean")  # a start that failed ran nothing

    def _stop_at_exit(self) -> None:
        if os.getpid() == self._pid:  # a forked child's exit never stops its parent's runtime
            self.stop()

    @property
    def running(self) -> bool:
        """Whether it is started, not stopped, in this process, with its runtime running."""
        return self._state == "running" and os.getpid() == self._pid and self.runtime.running

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        """The loop thread: start the runtime, wait for the stop request, drain."""
        # Ctrl-C is the caller's: the kernel gives a process's SIGINT to any thread that does
        # not block it, and Python runs the handler only in the main thread, so one that landed
        # here would wait for the main thread's next wake-up (test_ctrl_c_abandons...).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._drained.set_result(asyncio.run(self._main(started)))
        except BaseException as exc:  # the runtime's own failure: start() or stop() re-raise it
            if not started.done():
                started.set_exception(exc)
            self._drained.set_exception(exc)
        finally:
            # The loop is closed: a call whose task it never ran (or destroyed) is told so.
            with self._waiting_lock:
                left, self._waiting = self._waiting, set()
            for future in left:
                future.cancel()

    async def _main(self, started: concurrent.futures.Future[None]) -> DrainReport:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self.runtime.start()
        started.set_result(None)
        if not self._stop_requested:  # else asked before the event existed (Ctrl-C in start)
            await self._stopping.wait()
        return await self.runtime.stop()

    def _request_stop(self) -> None:
        self._stop_requested = True  # set first: _main reads it if the event is not there yet
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop already ended (its start failed)
                pass

    # --- the bridge ---------------------------------------------------------------------------

    def run(self, awaitable: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
        """Run a coroutine of the async API on the loop and wait for its result.

        ``rt.run(rt.runtime.get(Account, "a-1").deposit(cents=5))``: typed as the coroutine's
        result. It runs in a copy of this thread's context (``akter.as_caller`` applies).
        Exceptions are the coroutine's own. ``timeout`` (seconds) cancels it on the loop
        and raises ``TimeoutError``; a command it was running may still commit: retry with the
        same command id to learn its outcome.

        Raises:
            SyncRuntimeError: Not started, stopped (also when it stops while this call waits),
                a forked child, or called from a thread that runs an event loop.
        """
        try:
            loop = self._usable()
        except BaseException:
            awaitable.close()
            raise
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._waiting_lock:
            self._waiting.add(future)
        future.add_done_callback(self._settled)
        try:
            loop.call_soon_threadsafe(spawn, loop, awaitable, contextvars.copy_context(), future)
        except RuntimeError:  # the loop closed since _usable(): stopped under this call
            awaitable.close()
            future.cancel()
        try:
            done = _wait(future, timeout)
        except BaseException:  # KeyboardInterrupt: the call is abandoned, then drained by stop()
            future.cancel()
            raise
        if not done:
            future.cancel()
            raise TimeoutError(f"The call did not finish within {timeout} s; it was cancelled.")
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise SyncRuntimeError(
                "stopped",
                "The SyncRuntime stopped while the call waited; a command may have committed: "
                "retry it with the same command id on a running runtime to learn its outcome.",
            ) from None

    def _settled(self, future: concurrent.futures.Future[Any]) -> None:
        with self._waiting_lock:
            self._waiting.discard(future)

    def _usable(self) -> asyncio.AbstractEventLoop:
        self._check_process()
        self._refuse_event_loop("a blocking call")
        if self._state == "new":
            raise SyncRuntimeError(
                "not_started", "The SyncRuntime is not started: use 'with' or call start()."
            )
        loop = self._loop
        if self._state == "stopped" or loop is None or loop.is_closed():
            raise SyncRuntimeError("stopped", "The SyncRuntime was stopped.")
        return loop

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise SyncRuntimeError(
                "forked",
                f"This SyncRuntime was started by process {self._pid}, not this one "
                f"({os.getpid()}): a forked child (gunicorn --preload, multiprocessing 'fork') "
                "must start a SyncRuntime of its own, for example in a post_fork hook.",
            )

    def _refuse_event_loop(self, what: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise SyncRuntimeError(
            "event_loop",
            f"SyncRuntime: {what} from a thread that runs an event loop would block it; "
            "await the async API (rt.runtime) there instead.",
        )

    # --- addressing ---------------------------------------------------------------------------

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default") -> SyncHandle[A]:
        """A blocking handle to one actor (``rt.get(Billing)`` for a singleton).

        Raises:
            ActorError: ``InvalidInput`` for an invalid id or tenant, as ``runtime.get``.
        """
        return SyncHandle(self, actor, self.runtime.ref(actor, id, tenant=tenant))

    def create(self, actor: type[A], *, tenant: str = "default") -> SyncHandle[A]:
        """A blocking handle to a new actor with a minted UUIDv7 id; nothing is written yet."""
        return self.get(actor, uuid7(), tenant=tenant)

    def call(
        self,
        member: Callable[Concatenate[A, P], Coroutine[Any, Any, R]],
        id: str,
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """Call a command or query of the default tenant's actor ``id`` and wait for it.

        ``rt.call(Account.deposit, "a-1", cents=5)`` is ``rt.get(Account,
        "a-1").call(Account.deposit, cents=5)``; the actor type is the member's.
        """
        definition = getattr(member, "__akter_owner__", None)
        if not isinstance(definition, ActorDefinition):
            raise invalid_input(f"{member!r} is not a command or query of an akter actor.")
        return self.get(cast(type[A], definition.cls), id).call(member, *args, **kwargs)

    def outcome(self, cid: str, *, timeout: float = 30, ref: ActorRef | None = None) -> Any:
        """Wait for a command's receipt by id (``akter.stage``'s): its value, or its error raised.

        As ``await runtime.outcome(cid)``; ``ref`` names the actor when the id is not a staged
        System command's (a handle's, or one staged for a ``User``).

        Raises:
            akter.DeclaredError: The command's declared error.
            akter.ActorError: ``Timeout`` (no receipt within ``timeout`` s: pending, not yet
                committed, or rolled back), ``CommandExpired`` (``receipt_gone``).
        """
        return self.run(self.runtime.outcome(cid, timeout=timeout, ref=ref))

    def workflow_run(self, run_id: str) -> SyncWorkflowRun[Any]:
        """A blocking handle to a workflow run by id."""
        return SyncWorkflowRun(self, self.runtime.workflow_run(run_id))

    def mint_command_id(self) -> str:
        """A fresh command id from the framework clock (pin it for a retry-safe call)."""
        return self.run(self.runtime.mint_command_id())

    def __repr__(self) -> str:
        return f"<akter SyncRuntime {self._state} pid={self._pid}>"


class SyncHandle(Generic[A]):
    """A blocking handle to one actor: ``rt.get(Account, "a-1")``.

    Its calls take the member, so that the checker types them: ``handle.call(Account.deposit,
    cents=5)`` is what ``deposit`` returns. Each command call mints one command id (or uses
    the pinned one, :meth:`with_command_id`) and retries retryable failures with it, as an
    async handle does.
    """

    __slots__ = ("_actor", "_command_id", "_ref", "_rt")

    def __init__(
        self, rt: SyncRuntime, actor: type[A], ref: ActorRef, command_id: str | None = None
    ) -> None:
        self._rt = rt
        self._actor = actor
        self._ref = ref
        self._command_id = command_id

    @property
    def id(self) -> str:
        """The actor's id."""
        return self._ref.id

    @property
    def tenant(self) -> str:
        """The actor's tenant."""
        return self._ref.tenant

    @property
    def ref(self) -> ActorRef:
        """The actor's address."""
        return self._ref

    def with_command_id(self, command_id: str) -> SyncHandle[A]:
        """A handle whose next command call uses ``command_id`` (idempotent retries)."""
        return SyncHandle(self._rt, self._actor, self._ref, command_id)

    def call(
        self,
        member: Callable[Concatenate[A, P], Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """Call a command (one turn, with retries under one id) or a query, and wait for it.

        Raises:
            akter.DeclaredError: The command's declared error (replayed on a retry).
            akter.ActorError: A framework refusal (``InvalidInput`` naming the field, ...).
            SyncRuntimeError: The SyncRuntime cannot take calls.
        """
        name = getattr(member, "__name__", "")
        return cast(R, self._rt.run(self._call(name, member, args, kwargs)))

    async def _call(
        self, name: str, member: object, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        handle = self._async_handle()
        found = self._rt.runtime.definition(self._actor).members.get(name)
        if found is None or found.fn is not member:
            raise invalid_input(
                f"{member!r} is not a command or query of {self._ref.type}.", code="unknown_member"
            )
        return await getattr(handle, name)(*args, **kwargs)

    def start(
        self, flow: WorkflowMember[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> SyncWorkflowRun[R]:
        """Start a run of one of this actor's workflows (idempotent by the pinned command id)."""
        return SyncWorkflowRun(self._rt, self._rt.run(self._start(flow, args, kwargs)))

    async def _start(
        self, flow: WorkflowMember[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> WorkflowRun[R]:
        definition = self._rt.runtime.definition(self._actor)
        if definition.workflows.get(flow.name) is not flow:
            raise invalid_input(
                f"{flow!r} is not a workflow of {self._ref.type}.", code="unknown_member"
            )
        starter = getattr(self._async_handle(), flow.name)
        return cast(WorkflowRun[R], await starter.start(*args, **kwargs))

    def outcome(self, cid: str, *, timeout: float = 30) -> Any:
        """Wait for the receipt of this actor's command ``cid`` (``SyncRuntime.outcome``)."""
        return self._rt.outcome(cid, timeout=timeout, ref=self._ref)

    def events(self, after: str | None = None, limit: int = 1000) -> list[EventRecord]:
        """One page of the actor's committed events after the cursor ``after``."""
        return self._rt.run(self._events(after, limit))

    async def _events(self, after: str | None, limit: int) -> list[EventRecord]:
        records: list[EventRecord] = await self._async_handle().events(after, limit)
        return records

    def follow(
        self, after: str | None = None, *, idle_timeout: float | None = None
    ) -> Generator[EventRecord, None, None]:
        """Replay the events after ``after``, then follow new commits live (a generator).

        Each ``next()`` blocks until the next event; ``idle_timeout`` (seconds without an
        event) ends the feed with ``TimeoutError``. Close the generator (``break`` out of the
        ``for``) to stop following: its subscription on the loop is closed too.
        """
        feed = self._rt.run(self._subscribe(after))
        try:
            while True:
                record = self._rt.run(_next_of(feed), timeout=idle_timeout)
                if record is None:
                    return
                yield record
        finally:
            if self._rt.running:
                self._rt.run(feed.aclose())

    async def _subscribe(self, after: str | None) -> AsyncGenerator[EventRecord, None]:
        feed: AsyncGenerator[EventRecord, None] = self._async_handle().events(after).__aiter__()
        return feed

    def _async_handle(self) -> Any:
        handle = self._rt.runtime.get(self._actor, self._ref.id, tenant=self._ref.tenant)
        return handle if self._command_id is None else handle.with_command_id(self._command_id)

    def __repr__(self) -> str:
        return f"<akter sync handle {self._ref.type}/{self._ref.id!r} tenant={self._ref.tenant!r}>"


async def _next_of(feed: AsyncGenerator[EventRecord, None]) -> EventRecord | None:
    return await anext(feed, None)


class SyncWorkflowRun(Generic[T]):
    """A blocking handle to one workflow run (``handle.start(...)``, ``rt.workflow_run(id)``).

    Attributes:
        id: The run id.
        run: The async :class:`akter.WorkflowRun` it drives.
    """

    def __init__(self, rt: SyncRuntime, run: WorkflowRun[T]) -> None:
        self._rt = rt
        self.run = run
        self.id = run.id

    def result(self, timeout: float | timedelta | None = None) -> T:
        """Wait for the run to end and return its result (``WorkflowRun.result``'s errors).

        Raises:
            TimeoutError: ``timeout`` (seconds) passed first.
            akter.DeclaredError: The workflow raised a declared error.
            akter.WorkflowFailed: The workflow raised another exception.
            akter.WorkflowCancelled: The run was cancelled.
        """
        return self._rt.run(self.run.result(timeout))

    def status(self) -> WorkflowStatus:
        """The run's status and step journal."""
        return self._rt.run(self.run.status())

    def signal(self, signal: BaseModel) -> None:
        """Send ``signal`` to the run (a ``wf.wait`` of its class takes it)."""
        self._rt.run(self.run.signal(signal))

    def cancel(self) -> None:
        """Ask the run to cancel."""
        self._rt.run(self.run.cancel())

    def __repr__(self) -> str:
        return f"<akter sync workflow run {self.id!r}>"


def _wait(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
    """Wait for ``future`` up to ``timeout`` s (``None``: no bound); whether it is done.

    In slices of ``SIGNAL_POLL_S``: the main thread runs a signal's Python handler only between
    waits, and the kernel may have given the signal to a thread that does not block it.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SIGNAL_POLL_S
        if deadline is not None:
            left = min(left, deadline - time.monotonic())
        done, _ = concurrent.futures.wait([future], max(0.0, left))
        if done:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
