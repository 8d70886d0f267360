"""``akter.Resources``: set-up order, reverse teardown, a failing setup, lookups by typed key."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import akter
from akter.resources import OpenResources

FIRST = akter.Resource[str]("first")
SECOND = akter.Resource[str]("second")
SHARED = akter.Resource[list[str]]("shared")


def declared(log: list[str]) -> akter.Resources:
    resources = akter.Resources().provide(SHARED, log)
    for key in (FIRST, SECOND):

        @resources.setup(key)
        async def made(name: str = key.name) -> AsyncIterator[str]:
            log.append(f"open {name}")
            yield name
            log.append(f"close {name}")

    return resources


async def test_setups_run_in_order_and_teardowns_in_reverse() -> None:
    log: list[str] = []
    opened = OpenResources()
    await declared(log).open(opened)
    assert log == ["open first", "open second"]
    assert (opened.get(FIRST, "t"), opened.get(SECOND, "t")) == ("first", "second")
    assert opened.get(SHARED, "t") is log  # a provided value is the object itself
    await opened.close()
    assert log == ["open first", "open second", "close second", "close first"]
    with pytest.raises(akter.MissingResource, match="'first', which this runtime"):
        opened.get(FIRST, "Job 'j'")  # closed: nothing is left to look up
    await declared(log).open(opened)  # a runtime started again sets them up afresh
    assert opened.get(FIRST, "t") == "first"
    await opened.close()


async def test_a_failing_setup_tears_down_the_ones_before_it() -> None:
    log: list[str] = []
    resources = declared(log)
    broken = akter.Resource[int]("broken")

    @resources.setup(broken)
    async def fails() -> AsyncIterator[int]:
        raise OSError("refused")
        yield 0  # pragma: no cover - makes it a generator

    with pytest.raises(OSError, match="refused"):
        await resources.open(OpenResources())
    assert log == ["open first", "open second", "close second", "close first"]


def test_a_missing_resource_is_a_job_failure_that_names_it() -> None:
    error = akter.MissingResource(FIRST, "Job 'j-1' of Order 'o-1'")
    assert isinstance(error, akter.JobFailure) and not error.final
    assert error.key is FIRST
    assert str(error) == (
        "Job 'j-1' of Order 'o-1' asked for resource 'first', which this runtime does not "
        "provide; give the runtime resources= with a provide() or setup() for it."
    )


async def test_override_replaces_one_in_a_copy_and_leaves_the_original_alone() -> None:
    log: list[str] = []
    original = declared(log)
    copy = original.override(FIRST, "fake")
    assert copy is not original and FIRST in copy and SECOND in copy
    replaced, kept = OpenResources(), OpenResources()
    await copy.open(replaced)
    assert (replaced.get(FIRST, "t"), replaced.get(SECOND, "t")) == ("fake", "second")
    assert log == ["open second"]  # the replaced setup never ran
    await original.open(kept)
    assert kept.get(FIRST, "t") == "first"
    await replaced.close()
    await kept.close()
    assert repr(FIRST) == "akter.Resource('first')"
