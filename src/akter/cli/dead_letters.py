"""``akter dead-letters list|show|retry|discard``: the jobs that failed for good.

``retry`` and ``discard`` take job ids, or ``--all`` (narrowed by ``--type`` and ``--job``),
and show a progress bar over the letters; a letter another operator took meanwhile is skipped
with a warning.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from akter.cli._common import (
    JsonOption,
    Steps,
    TargetArg,
    operate,
    refusals_exit,
    stderr,
    stdout,
)
from akter.cli._tables import (
    Col,
    WideOption,
    is_full_id,
    print_table,
    resolve_id,
)
from akter.errors import ActorError, ConfigurationError
from akter.operators.dead_letters import Letter
from akter.runtime import Runtime

letters_app = typer.Typer(
    name="dead-letters", help="Dead letters: list, show, retry, discard.", no_args_is_help=True
)

#: Most letters one ``--all`` takes (newest first); run it again for the rest.
_ALL_LIMIT = 100_000


def _letter_json(letter: Letter) -> dict[str, Any]:
    return letter.to_json()


@letters_app.command("list")
def letters_list(target: TargetArg, as_json: JsonOption = False, wide: WideOption = False) -> None:
    """List dead letters, newest first (never pruned; short job ids, --wide for full ones)."""
    with refusals_exit():
        letters = operate(target, lambda rt: rt.operators.dead_letters.list())
        if as_json:
            print(json.dumps([_letter_json(x) for x in letters], default=str))
            return
        print_table(
            stdout,
            "dead letters",
            [
                Col("job id", "id"),
                Col("actor", "text"),
                Col("job", "text"),
                Col("attempts", "number"),
                Col("ambiguous"),
                Col("cause", "text"),
            ],
            [
                [
                    x.job_id,
                    f"{x.ref.type}/{x.ref.id}",
                    x.job,
                    str(x.attempts),
                    "yes" if x.ambiguous else "no",
                    x.cause,
                ]
                for x in letters
            ],
            wide=wide,
        )


async def _letter_id(rt: Runtime, given: str) -> str:
    """The letter ``given`` names: a full job id as it is, a short one looked up."""
    if is_full_id(given):
        return given
    letters = await rt.operators.dead_letters.list(limit=_ALL_LIMIT)
    return resolve_id(given, (x.job_id for x in letters), "dead letter")


@letters_app.command("show")
def letters_show(
    target: TargetArg,
    job_id: Annotated[str, typer.Argument(help="The job id, or its short form as listed.")],
) -> None:
    """Show one dead letter as JSON."""
    with refusals_exit():

        async def work(rt: Runtime) -> Letter:
            return await rt.operators.dead_letters.show(await _letter_id(rt, job_id))

        letter = operate(target, work)
        print(json.dumps(_letter_json(letter), default=str))


JobIdsArg = Annotated[
    list[str] | None,
    typer.Argument(help="Job ids of the letters, or their short forms (or use --all)."),
]
AllOption = Annotated[bool, typer.Option("--all", help="Every letter (narrow with filters).")]
TypeFilter = Annotated[
    str | None, typer.Option("--type", help="With --all: only letters of this actor type.")
]
JobFilter = Annotated[
    str | None, typer.Option("--job", help="With --all: only letters of this job name.")
]


@dataclass
class _Selection:
    ids: list[str]
    every: bool
    actor_type: str | None
    job: str | None

    def check(self) -> None:
        if self.ids and self.every:
            raise ConfigurationError("Name letters by job id or pass --all, not both.")
        if not self.ids and not self.every:
            raise ConfigurationError("Name the letters by job id, or pass --all.")
        if (self.actor_type or self.job) and not self.every:
            raise ConfigurationError("--type and --job narrow --all; pass --all with them.")

    async def letters(self, rt: Runtime) -> list[Letter]:
        """The named letters (all must exist), or every letter that matches the filters."""
        if not self.every:
            ids = [await _letter_id(rt, given) for given in self.ids]
            return [await rt.operators.dead_letters.show(job_id) for job_id in dict.fromkeys(ids)]
        return [
            x
            for x in await rt.operators.dead_letters.list(limit=_ALL_LIMIT)
            if (self.actor_type is None or x.ref.type == self.actor_type)
            and (self.job is None or x.job == self.job)
        ]


@contextlib.contextmanager
def _over(letters: list[Letter], description: str) -> Iterator[Steps]:
    with Steps(description, len(letters)) as steps:
        if not letters:
            steps.note("no dead letters match")
        yield steps


async def _each(
    rt: Runtime, letters: list[Letter], description: str, act: Any
) -> tuple[list[tuple[Letter, Any]], list[Letter]]:
    """Apply ``act`` to each letter with a progress bar; letters gone meanwhile are skipped."""
    done: list[tuple[Letter, Any]] = []
    gone: list[Letter] = []
    with _over(letters, description) as steps:
        for letter in letters:
            try:
                done.append((letter, await act(letter.job_id)))
            except ActorError as exc:
                if exc.code != "unknown_dead_letter":
                    raise
                gone.append(letter)  # another operator took it first
            steps.update(message=letter.job_id)
    for letter in gone:
        stderr.print(
            f"[yellow]warning:[/yellow] dead letter {letter.job_id} was already gone; skipped."
        )
    return done, gone


def _apply(
    target: str,
    selection: _Selection,
    label: str,
    operation: Callable[[Runtime], Callable[[str], Awaitable[Any]]],
) -> list[tuple[Letter, Any]]:
    """Run ``operation(runtime)`` on each selected letter (a runtime started quietly)."""
    selection.check()

    async def work(rt: Runtime) -> tuple[list[tuple[Letter, Any]], list[Letter]]:
        return await _each(rt, await selection.letters(rt), label, operation(rt))

    done: list[tuple[Letter, Any]] = operate(target, work)[0]
    return done


@letters_app.command("retry")
def letters_retry(
    target: TargetArg,
    job_ids: JobIdsArg = None,
    every: AllOption = False,
    actor_type: TypeFilter = None,
    job: JobFilter = None,
    as_json: JsonOption = False,
) -> None:
    """Re-enqueue dead letters as new jobs (new ids, printed one per line); warns if ambiguous."""
    with refusals_exit():
        selection = _Selection(list(job_ids or []), every, actor_type, job)
        done = _apply(
            target, selection, "retrying dead letters", lambda rt: rt.operators.dead_letters.retry
        )
        ambiguous = [letter.job_id for letter, _ in done if letter.ambiguous]
        if ambiguous:
            stderr.print(
                f"[yellow]warning:[/yellow] {len(ambiguous)} of these letters "
                f"({', '.join(ambiguous)}) are ambiguous: the provider may already have applied "
                "the call; the retry runs it again under a new job id."
            )
        if as_json:
            print(json.dumps([{"job_id": x.job_id, "new_job_id": new} for x, new in done]))
            return
        for _, new_id in done:
            print(new_id)


@letters_app.command("discard")
def letters_discard(
    target: TargetArg,
    job_ids: JobIdsArg = None,
    every: AllOption = False,
    actor_type: TypeFilter = None,
    job: JobFilter = None,
    as_json: JsonOption = False,
) -> None:
    """Delete dead letters (printed one per line as they are discarded)."""
    with refusals_exit():
        selection = _Selection(list(job_ids or []), every, actor_type, job)
        done = _apply(
            target,
            selection,
            "discarding dead letters",
            lambda rt: rt.operators.dead_letters.discard,
        )
        if as_json:
            print(json.dumps([x.job_id for x, _ in done]))
            return
        for letter, _ in done:
            stdout.print(f"discarded {letter.job_id}")


__all__ = ["letters_app"]
