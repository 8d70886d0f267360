"""Override an actor definition's policy for part of a test, restoring the original object."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import akter
from akter.actor import definition_of


@contextmanager
def policy_override(actor: type[akter.Actor[Any]], policy: akter.Policy) -> Iterator[None]:
    """Run the block with ``actor`` under ``policy`` (resolved for it).

    The definition is shared by every test in the process, so the original resolved policy
    object is put back on exit, whatever the block raised.

    Args:
        actor: The actor class whose definition's policy is replaced.
        policy: The policy in force inside the block.
    """
    definition = definition_of(actor)
    original = definition.policy
    definition.policy = policy.resolve(definition.name)
    try:
        yield
    finally:
        definition.policy = original
