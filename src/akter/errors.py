"""The error hierarchy: one root, framework reasons, declared errors and internal signals.

Every error a caller can see derives from :class:`AkterError`. Framework refusals are
:class:`ActorError` with a ``reason`` (semantics §2.9) that says whether retrying with the same
command id can help. User-declared business failures subclass :class:`DeclaredError`; they are
stored in the receipt and replay as the same class with the same fields.

``LeaseLost`` refuses a command sent from a singleton's ``run()`` loop whose lease is no longer
the current one (another runner took it over, or it ended): the loop's handles are fenced on
their lease, so a stale owner's command never commits and writes no receipt.

Internal control-flow signals (an injected crash, an escaped capability inside the engine) derive
from ``BaseException`` so that a handler's ``except Exception`` cannot swallow them.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

Reason = Literal[
    "ActorUnavailable",
    "RunnerAtCapacity",
    "Timeout",
    "InvalidCommandId",
    "CommandConflict",
    "CommandExpired",
    "NotCreated",
    "Unauthorized",
    "InvalidInput",
    "Defect",
    "UnknownCursor",
    "RetentionGap",
    "LeaseLost",
    "StateTooNew",
]


class AkterError(Exception):
    """Base class of every error raised by akter."""


class ConfigurationError(AkterError):
    """The runtime's configuration is invalid or disagrees with the database."""


class DefinitionError(AkterError):
    """An actor, command, query, job or schedule declaration is invalid."""


class DrainError(AkterError):
    """The outbox did not settle within the drain's round limit."""


class CapabilityEscaped(AkterError):
    """A turn capability was used after its turn ended or from another task."""


class ReadOnlyError(AkterError):
    """A query tried to write: query views are read-only."""


class ActorError(AkterError):
    """A framework refusal or failure of one command, with a machine-readable ``reason``.

    Attributes:
        reason: One of the reasons of semantics §2.9.
        code: A finer code (``malformed``, ``future``, ``access_denied`` ...) or ``None``.
        retryable: Whether retrying with the same command id may succeed.
        retry_after: Suggested wait in seconds before a retry, or ``None``.
        command_id: The command id involved, when there is one.
        field: For ``InvalidInput``, the offending field, when known.
    """

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
        command_id: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message
        self.code = code
        if retryable is None:
            retryable = reason in (
                "ActorUnavailable",
                "RunnerAtCapacity",
                "Timeout",
                "StateTooNew",
            )
        self.retryable = retryable
        if retry_after is None and reason == "ActorUnavailable":
            retry_after = 0.25 * random.uniform(0.8, 1.2)
        elif retry_after is None and reason in ("RunnerAtCapacity", "StateTooNew"):
            # StateTooNew: a newer runner (a rolling deploy) may serve the retry (evolution E1).
            retry_after = 1.0
        self.retry_after = retry_after
        self.command_id = command_id
        self.field = field

    def __repr__(self) -> str:
        return f"ActorError({self.reason!r}, {self.message!r}, code={self.code!r})"


def unavailable(message: str, *, command_id: str | None = None) -> ActorError:
    """A retryable ``ActorUnavailable`` error."""
    return ActorError("ActorUnavailable", message, command_id=command_id)


def invalid_input(message: str, *, field: str | None = None, code: str | None = None) -> ActorError:
    """A terminal ``InvalidInput`` error naming the field when known."""
    return ActorError("InvalidInput", message, field=field, code=code)


def invalid_input_from(exc: ValidationError, what: str) -> ActorError:
    """Turn a pydantic validation error into ``InvalidInput`` naming the first bad field."""
    first = exc.errors()[0] if exc.errors() else None
    loc = ".".join(str(p) for p in first["loc"]) if first else None
    detail = first["msg"] if first else str(exc)
    where = f" field {loc!r}" if loc else ""
    return ActorError("InvalidInput", f"Invalid {what}:{where} {detail}.", field=loc)


_DECLARED: dict[str, type[DeclaredError]] = {}


class DeclaredError(AkterError):
    """Base of user-declared business errors: typed, stored in the receipt, replayed.

    Subclasses declare pydantic-validated fields as class annotations::

        class OutOfStock(akter.DeclaredError):
            sku: str

        raise OutOfStock(sku="A-1")

    The tag is the class name unless given with ``class X(DeclaredError, tag="..."):``.
    """

    tag: ClassVar[str] = "DeclaredError"
    _fields_model: ClassVar[type[BaseModel]]

    def __init_subclass__(cls, *, tag: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.tag = tag or cls.__name__
        annotations: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            annotations.update(
                {
                    k: v
                    for k, v in getattr(klass, "__annotations__", {}).items()
                    if not k.startswith("_") and k not in ("tag",)
                }
            )
        fields: dict[str, Any] = {}
        for name, annotation in annotations.items():
            default = cls.__dict__.get(name, ...)
            fields[name] = (annotation, default)
        cls._fields_model = create_model(
            f"{cls.__name__}Fields",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
        existing = _DECLARED.get(cls.tag)
        same = existing is not None and (existing.__module__, existing.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if existing is not None and not same:
            raise DefinitionError(
                f"Declared error tag {cls.tag!r} is used by {existing.__qualname__!r} and "
                f"{cls.__qualname__!r}; give one of them tag=... ."
            )
        _DECLARED[cls.tag] = cls

    def __init__(self, message: str | None = None, /, **fields: Any) -> None:
        model = type(self)._fields_model
        validated = model.model_validate(fields)
        try:
            self.fields: dict[str, Any] = validated.model_dump(mode="json")
        except ValueError as exc:  # a value an Any field holds that JSON cannot carry
            from akter._json import Unstorable, unserializable_path

            raise Unstorable(unserializable_path(validated, type(self).tag), str(exc)) from None
        for name in model.model_fields:
            object.__setattr__(self, name, getattr(validated, name))
        super().__init__(message or f"{type(self).tag}({self.fields})")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DeclaredError)
            and type(other) is type(self)
            and (other.fields == self.fields)
        )

    def __hash__(self) -> int:
        return hash((type(self).tag, tuple(sorted(map(str, self.fields.items())))))

    @classmethod
    def from_receipt(cls, tag: str, fields: dict[str, Any], message: str | None) -> DeclaredError:
        """Rebuild a stored declared error (replay)."""
        klass = _DECLARED.get(tag)
        if klass is None:
            return UnknownDeclaredError(message, stored_tag=tag, stored=fields)
        return klass(message, **fields)


class UnknownDeclaredError(DeclaredError, tag="$unknown"):
    """A stored declared error whose class this process does not define."""

    stored_tag: str
    stored: dict[str, Any]


class JobFailure(AkterError):
    """Raised by an executor to report a known failure: the provider did not apply the call.

    Args:
        cause: What failed, in words.
        final: ``True`` stops retries at once.
    """

    def __init__(self, cause: str, *, final: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.final = final


class WorkflowCancelled(AkterError):
    """The workflow run was cancelled (``run.cancel()``, or its ``timeout=`` passed).

    Raised at the run's next durable await; the workflow may catch it and run compensating
    steps. Raised by ``await run.result()`` of a cancelled run.
    """

    def __init__(self, message: str = "The workflow run was cancelled.") -> None:
        super().__init__(message)


class WorkflowFailed(AkterError):
    """``await run.result()`` of a run whose code raised (not a declared error).

    Attributes:
        run_id: The run.
        type: The class name of the exception that escaped the workflow.
        message: Its message.
    """

    def __init__(self, run_id: str, type: str, message: str) -> None:
        super().__init__(f"Workflow run {run_id!r} failed: {type}: {message}")
        self.run_id = run_id
        self.type = type
        self.message = message


class WorkflowDiverged(AkterError):
    """``await run.result()`` of a run parked as ``diverged`` (its code changed under it).

    An operator retries it after a fix (``akter workflows retry RUN``) or cancels it.
    """


class JobDeadLettered(AkterError):
    """A workflow's job step ran out of attempts (or failed finally): the job's dead letter.

    Attributes:
        letter: The dead letter (``akter.DeadLetter``): attempts, cause, and ``ambiguous``
            (the provider may have applied the call).
    """

    def __init__(self, letter: Any) -> None:
        super().__init__(
            f"Job {letter.job_id!r} was dead-lettered after {letter.attempts} attempt(s): "
            f"{letter.cause}" + (" (it may have been applied)" if letter.ambiguous else "")
        )
        self.letter = letter


class JobCancelled(AkterError):
    """A workflow's job step was cancelled.

    Attributes:
        report: What is known of the job (``akter.jobs.Cancelled``): its outcome (``Succeeded``,
            ``Failed`` or ``Unknown``) and ``ambiguous``.
    """

    def __init__(self, report: Any) -> None:
        super().__init__(f"Job {report.job_id!r} was cancelled ({report.outcome.kind}).")
        self.report = report


class StepFailed(AkterError):
    """A workflow's local step (``wf.step``) failed on every attempt.

    Attributes:
        step: The step's function name.
        attempts: How many attempts ran.
        cause: The last attempt's error, in words.
    """

    def __init__(self, step: str, attempts: int, cause: str) -> None:
        super().__init__(f"Step {step!r} failed after {attempts} attempt(s): {cause}")
        self.step = step
        self.attempts = attempts
        self.cause = cause


class InjectedCrash(BaseException):
    """A simulated process death at a fault-injection point (testing only)."""

    def __init__(self, point: str) -> None:
        super().__init__(f"Injected crash at {point!r}")
        self.point = point


__all__ = [
    "ActorError",
    "AkterError",
    "CapabilityEscaped",
    "ConfigurationError",
    "DeclaredError",
    "DefinitionError",
    "DrainError",
    "InjectedCrash",
    "JobCancelled",
    "JobDeadLettered",
    "JobFailure",
    "ReadOnlyError",
    "Reason",
    "StepFailed",
    "UnknownDeclaredError",
    "WorkflowCancelled",
    "WorkflowDiverged",
    "WorkflowFailed",
    "invalid_input",
    "invalid_input_from",
    "unavailable",
]
