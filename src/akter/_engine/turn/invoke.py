"""Running one command's handler on a private state, and checking what it made.

The cache keeps a warm actor's state as its stored JSON text; each handler decodes its own
model from it exactly as a cold load decodes the stored row, so nothing a handler does reaches
the cache unless its turn commits, and no decoded model outlives its turn
(docs/internals/state-cache.md).

A handler's result, its declared error and its new state must be storable and valid; anything
else is a defect of the command (``BatchDefect``), raised before the commit flight is built.
The caller's reply is decoded from the receipt's stored JSON, exactly as a replay decodes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
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

Ran = tuple[Outcome, CommandContext | None]

#: The largest cached state (characters of its stored JSON) decoded ahead by :class:`Prepared`.
PREPARED_STATE_CHARS = 65_536


def decoded(definition: ActorDefinition, stored: str) -> BaseModel:
    """The model a cold load decodes from a current-version row's stored JSON text."""
    return definition.state_model.model_validate(stored_value(stored))


class Prepared:
    """A batch's handler inputs made while its admission flight is out (``TurnPipeline.sync``).

    Each command's payload hash (:meth:`Request.digest`) and arguments, and the first handler's
    state decoded from the cached text: none of them needs the flight's answers, so the
    server's time covers their cost. A decode is used only for the text it was made from (the
    admission may replace the cache), and each input only once; whatever is missing is made
    when the handler runs. A state is decoded ahead only when no load left a model to take
    (``Activation.loaded``) and its text is at most :data:`PREPARED_STATE_CHARS` long: where
    other runners write the same actor, the admission replaces the cache often, and each time
    a decode made ahead is wasted.
    """

    __slots__ = ("_arguments", "_made")

    def __init__(self) -> None:
        self._arguments: list[dict[str, Any] | None] = []
        self._made: tuple[str, BaseModel] | None = None

    def fill(self, act: Activation, batch: Sequence[Request]) -> None:
        """Make the inputs; never raises (a failure is met again where the handler runs)."""
        with contextlib.suppress(Exception):
            for request in batch:
                request.digest()
            stored = act.state_json
            if act.loaded is None and stored is not None and len(stored) <= PREPARED_STATE_CHARS:
                self._made = (stored, decoded(act.definition, stored))
            self._arguments = [r.member.arguments(r.payload) for r in batch]

    def state(self, act: Activation, stored: str) -> BaseModel:
        """A private model of the state ``stored`` (JSON text) for a handler: its own to change.

        The model a load left (``Activation.loaded``) is taken by the first handler of the text
        it was decoded with; otherwise the text is decoded, here or ahead by :meth:`fill`.
        """
        loaded = act.loaded
        if loaded is not None and stored is act.state_json:
            act.loaded = None
            return loaded
        made, self._made = self._made, None
        if made is not None and made[0] is stored:
            return made[1]
        return decoded(act.definition, stored)

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
    stored: str,
    *,
    window_ms: int,
    hooks: Hooks,
    prepared: Prepared,
    keyed_runs: dict[tuple[str, str], str] | None = None,
    owned: OwnedTurn | None = None,
) -> Ran:
    """Run the command's handler on the state ``stored`` (JSON text): its outcome and context.

    A successful outcome carries the new state's text (``Outcome.state_json``); a declared
    error returns no context (the state and everything the handler staged are not written).
    ``prepared`` holds inputs made while the admission flight was out; ``keyed_runs`` the runs
    the batch's keyed starts name (``BatchWrites.keyed``); ``owned`` the batch's owned rows.

    Raises:
        BatchDefect: The handler failed, returned or left something akter cannot store.
    """
    definition = act.definition
    member = request.member
    state = _private(act, index, lambda: prepared.state(act, stored))
    ctx = CommandContext(
        definition=definition,
        ref=act.ref,
        caller=request.caller,
        command_id=request.command_id.raw,
        now_ms=now_ms,
        state=state,
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
        return _declared(ctx, exc, request, index), None
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
        mirrored = any(table.mirror is not None for table in definition.tables)
        before = _private(act, index, lambda: decoded(definition, stored)) if mirrored else None
        rows.end(ok=True, states=(before, new_state) if before is not None else None)
    # The reply is decoded from the receipt's stored JSON, exactly as a replay decodes it, but
    # only once the commit flight is out (decode_replies): only the caller needs it.
    expires = request.command_id.expires_ms
    return Outcome(Result("ok"), receipt, expires, state_json, reply=member), ctx


def _private(act: Activation, index: int, decode: Callable[[], BaseModel]) -> BaseModel:
    """A decode of the cached text; one that fails is the command's defect, before its handler.

    Text this runner wrote was decoded once before its commit (:func:`_new_state`); a load's
    text is the dump of a validated model. Only validators that refuse their own output fail.
    """
    try:
        return decode()
    except (ValidationError, ValueError, TypeError) as exc:
        raise BatchDefect(
            index, f"The state of {act.ref.type}/{act.ref.id!r} cannot be decoded again: {exc}"
        ) from None


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
    """The handler's new state as the next turn will decode it, and its stored JSON text.

    The text is decoded here once, as the next turn will decode it: a state whose validators
    refuse their own output fails this command, before its commit, instead of the next. The
    model is returned for the owned tables' state indexes only; the cache keeps the text.
    """
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
