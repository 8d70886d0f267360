"""Running one command's handler on a private copy of the state, and checking what it made.

A handler's result, its declared error and its new state must be storable and valid; anything
else is a defect of the command (``BatchDefect``), raised before the commit flight is built.
The caller's reply is decoded from the receipt's stored JSON, exactly as a replay decodes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from akter._contexts import IN_TURN, CommandContext, bind
from akter._engine.hooks import Hooks
from akter._engine.turn.owned import OwnedTurn, RowsReadFailed
from akter._engine.turn.rules import receipt_result
from akter._engine.turn.types import (
    EVENT_BYTES_LIMIT,
    Activation,
    BatchDefect,
    Outcome,
    Request,
    Result,
)
from akter._json import Unstorable, check_finite, storable_json, stored_value, unserializable_path
from akter.actor import ActorDefinition, Member
from akter.errors import DeclaredError, InjectedCrash

Ran = tuple[Outcome, BaseModel | None, CommandContext | None]

#: The largest cached state (characters of its stored JSON) copied ahead by :class:`Prepared`.
PREPARED_STATE_CHARS = 65_536


class Prepared:
    """A batch's handler inputs made while its admission flight is out (``TurnPipeline.sync``).

    Each command's payload hash (:meth:`Request.digest`) and arguments, and a private copy of
    the cached state for the first handler: none of them needs the flight's answers, so the
    server's time covers their cost. A copy is
    used only for the state it was made from (the admission may replace the cache), and each
    input only once; whatever is missing is made when the handler runs, as it was before. The
    copy is made ahead only for a state of at most :data:`PREPARED_STATE_CHARS` of stored JSON:
    where other runners write the same actor, the admission replaces the cache often, and each
    time a copy made ahead is wasted.
    """

    __slots__ = ("_arguments", "_copy")

    def __init__(self) -> None:
        self._arguments: list[dict[str, Any] | None] = []
        self._copy: tuple[BaseModel, BaseModel] | None = None

    def fill(self, act: Activation, batch: Sequence[Request]) -> None:
        """Make the inputs; never raises (a failure is met again where the handler runs)."""
        with contextlib.suppress(Exception):
            for request in batch:
                request.digest()
            state, stored = act.state, act.state_json
            if state is not None and stored is not None and len(stored) <= PREPARED_STATE_CHARS:
                self._copy = (state, state.model_copy(deep=True))
            self._arguments = [r.member.arguments(r.payload) for r in batch]

    def state(self, state: BaseModel) -> BaseModel:
        """A private deep copy of ``state`` for a handler."""
        made, self._copy = self._copy, None
        if made is not None and made[0] is state:
            return made[1]
        return state.model_copy(deep=True)

    def arguments(self, index: int, request: Request) -> dict[str, Any]:
        """The handler's arguments for the batch's ``index``-th command."""
        if index < len(self._arguments):
            made = self._arguments[index]
            if made is not None:
                self._arguments[index] = None
                return made
        return request.member.arguments(request.payload)


async def run_handler(
    act: Activation,
    request: Request,
    index: int,
    now_ms: int,
    state: BaseModel,
    *,
    window_ms: int,
    hooks: Hooks,
    prepared: Prepared,
    keyed_runs: dict[tuple[str, str], str] | None = None,
    owned: OwnedTurn | None = None,
) -> Ran:
    """Run the command's handler: its outcome, the state after it and its context.

    A declared error keeps ``state`` and returns no context (nothing it staged is written).
    ``prepared`` holds inputs made while the admission flight was out; ``keyed_runs`` the runs
    the batch's keyed starts name (``BatchWrites.keyed``); ``owned`` the batch's owned rows.

    Raises:
        BatchDefect: The handler failed, returned or left something akter cannot store.
    """
    definition = act.definition
    member = request.member
    ctx = CommandContext(
        definition=definition,
        ref=act.ref,
        caller=request.caller,
        command_id=request.command_id.raw,
        now_ms=now_ms,
        state=prepared.state(state),
        window_ms=window_ms,
        keyed_runs=keyed_runs,
    )
    rows = owned.command(ctx) if owned is not None else None
    instance = bind(ctx)
    if hooks.armed("before_handler"):
        await hooks.at("before_handler", {"ref": act.ref, "command": member.name})
    arguments = prepared.arguments(index, request)
    token = IN_TURN.set(ctx)
    ctx.activate()
    try:
        value = await member.fn(instance, **arguments)
    except DeclaredError as exc:
        ctx.active = False
        if rows is not None:
            rows.end(ok=False)  # its rows are dropped, and undone if a read sent them
        return _declared(ctx, exc, request, index), state, None
    except RowsReadFailed as failed:
        raise failed.error from None  # the turn fails as a failed flight does
    except (TimeoutError, asyncio.CancelledError, InjectedCrash):
        if ctx.poisoned:
            raise BatchDefect(index, ctx.poisoned) from None
        raise
    except Exception as exc:
        raise BatchDefect(
            index, f"{definition.name}.{member.name} raised {type(exc).__name__}: {exc}"
        ) from None
    except BaseException:
        if ctx.poisoned:  # a handle call from inside the turn
            raise BatchDefect(index, ctx.poisoned) from None
        raise
    finally:
        ctx.active = False
        IN_TURN.reset(token)
    if ctx.poisoned:
        raise BatchDefect(index, ctx.poisoned)
    receipt = _result_receipt(definition, member, value, index)
    new_state, state_json = _new_state(act, ctx.state, index)
    _check_sizes(act, ctx, state_json, index)
    if rows is not None:
        rows.end(ok=True, states=(state, new_state))
    # The reply is decoded from the receipt's stored JSON, exactly as a replay decodes it, but
    # only once the commit flight is out (decode_replies): only the caller needs it.
    expires = request.command_id.expires_ms
    return Outcome(Result("ok"), receipt, expires, state_json, reply=member), new_state, ctx


def decode_replies(outcomes: Sequence[Outcome]) -> None:
    """Decode each reply still owed from its receipt, exactly as a replay decodes it.

    The engine runs it while the commit flight is out, and again after it (a no-op then). It
    does not raise: :func:`receipt_result` returns a value its annotation cannot read as stored.
    """
    for outcome in outcomes:
        member, receipt = outcome.reply, outcome.receipt
        if member is not None and receipt is not None:
            outcome.reply = None
            outcome.result = receipt_result(member, stored_value(receipt))


def _declared(ctx: CommandContext, exc: DeclaredError, request: Request, index: int) -> Outcome:
    """The outcome of a declared error: its receipt, and the caller's result."""
    definition = ctx.definition
    member = request.member
    if ctx.poisoned:
        raise BatchDefect(index, ctx.poisoned) from None
    allowed = member.spec.errors
    if allowed and not isinstance(exc, allowed):
        raise BatchDefect(
            index,
            f"{definition.name}.{member.name} raised {type(exc).__name__}, which it does "
            "not declare in errors=.",
        ) from None
    try:
        check_finite(_error_fields(exc), "error")
        receipt = storable_json({"error": type(exc).tag, "fields": exc.fields}, "error")
    except Unstorable as bad:
        raise BatchDefect(
            index,
            f"{definition.name}.{member.name} raised {type(exc).__name__} with a field "
            f"akter cannot store: {bad}.",
        ) from None
    # The caller sees what a replay of the receipt will show (plus the raised message).
    outcome = receipt_result(member, stored_value(receipt), message=str(exc))
    return Outcome(outcome, receipt, request.command_id.expires_ms)


def _result_receipt(definition: ActorDefinition, member: Member, value: Any, index: int) -> str:
    """The receipt text of a returned value, checked against the command's annotation."""
    try:
        check_finite(value, "result")
        checked = member.result.validate_python(value)
        result_json = storable_json(member.result.dump_python(checked, mode="json"), "result")
    except ValidationError as exc:
        raise BatchDefect(
            index,
            f"{definition.name}.{member.name} returned a value that fails its annotation: "
            f"{exc.errors()[0]['msg'] if exc.errors() else exc}",
        ) from None
    except (ValueError, TypeError, RecursionError) as exc:  # Unstorable, serialization
        raise BatchDefect(
            index,
            f"{definition.name}.{member.name} returned a value akter cannot store: "
            f"{_named(exc, value, 'result')}.",
        ) from None
    return '{"ok":' + result_json + "}"  # canonical: one key


def _new_state(act: Activation, state: BaseModel, index: int) -> tuple[BaseModel, str]:
    """The handler's new state as the next turn will see it, and its stored JSON text."""
    definition = act.definition
    try:
        python_state = state.model_dump(mode="python")
        check_finite(python_state, "state")
        new_state = definition.state_model.model_validate(python_state)
        state_json = storable_json(new_state.model_dump(mode="json"), "state")
        # What the next turn sees is what a cold load of the stored row would decode.
        new_state = definition.state_model.model_validate(stored_value(state_json))
    except ValidationError as exc:
        raise BatchDefect(index, f"The new state of {act.ref.type} is invalid: {exc}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise BatchDefect(
            index,
            f"The new state of {act.ref.type}/{act.ref.id!r} cannot be stored: "
            f"{_named(exc, state, 'state')}.",
        ) from None
    return new_state, state_json


def _check_sizes(act: Activation, ctx: CommandContext, state_json: str, index: int) -> None:
    limit = act.definition.policy.max_state_bytes
    size = len(state_json.encode())
    if size > limit:
        raise BatchDefect(
            index,
            f"The new state of {act.ref.type}/{act.ref.id!r} is {size} bytes, over "
            f"max_state_bytes={limit}.",
        )
    event_bytes = sum(len(e.payload.encode()) for e in ctx.staged.events)
    if event_bytes > EVENT_BYTES_LIMIT:
        raise BatchDefect(index, f"The command's events total {event_bytes} bytes, over 1,048,576.")


def _named(exc: BaseException, value: Any, path: str) -> str:
    """An encoding failure's message, naming the path inside ``value`` where it can."""
    if isinstance(exc, Unstorable):
        return str(exc) if exc.path.startswith(path) else f"{path}: {exc}"
    if isinstance(exc, RecursionError):
        return f"{path} nests too deeply to encode"
    return f"{unserializable_path(value, path)}: {exc}"


def _error_fields(exc: DeclaredError) -> dict[str, Any]:
    """A declared error's fields as the handler set them (before JSON mode turned NaN to null)."""
    return {name: getattr(exc, name, None) for name in type(exc)._fields_model.model_fields}
