"""The fake provider of a test module, fresh for every test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from akter.testing.provider import FakeProvider


def fresh_provider(shared: FakeProvider) -> Callable[[], Iterator[FakeProvider]]:
    """An autouse ``provider`` fixture: ``shared`` reset before and after each test.

    A module binds it under the fixture's name: ``provider = fresh_provider(PROVIDER)``.
    """

    @pytest.fixture(autouse=True, name="provider")
    def provider() -> Iterator[FakeProvider]:
        shared.reset()
        yield shared
        shared.reset()

    return provider
