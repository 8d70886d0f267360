"""What a runner's state models declare, recorded so that an older runner can tell a newer row.

A deploy that only adds defaulted fields keeps the state version (evolution EVO-01), so a row it
writes carries keys an older model would drop on its next write (the loss guard). Two records
let the older runner tell that row from one that would really lose data (evolution E4):

- the deployment's name registry gets, once per model, the kind ``state`` and the model's
  fingerprint (its state version and declared key paths) at the time the model was first
  recorded: which of two models of a type is newer;
- each runner's registry row gets, per hosted type, its state version, fingerprint and declared
  key paths (migration 0014): which models run now.

A row whose dropped keys a live runner's newer model declares, at the row's state version, is
refused with ``StateTooNew`` (``akter._engine.turn.too_new``); any other loss keeps the guard's
``Defect``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from akter._evolution import declared_paths
from akter._members import ActorDefinition

#: The registry kind of a model's fingerprint (``deployment_names.kind``, migration 0014).
KIND = "state"


def fingerprint(definition: ActorDefinition) -> str:
    """``v<state version>:<hash of the declared key paths>``: one model of one type."""
    paths = "\n".join(sorted(declared_paths(definition.state_model)))
    digest = hashlib.sha256(paths.encode()).hexdigest()[:16]
    return f"v{definition.state_version}:{digest}"


def declared(definitions: Iterable[ActorDefinition]) -> dict[str, dict[str, Any]]:
    """Per type: the state version, fingerprint and declared key paths (a runner's row)."""
    return {
        d.name: {
            "version": d.state_version,
            "model": fingerprint(d),
            "paths": sorted(declared_paths(d.state_model)),
        }
        for d in definitions
    }


def names(definitions: Iterable[ActorDefinition]) -> list[tuple[str, str, str]]:
    """The ``(type, "state", fingerprint)`` names to record at start (the first record stays)."""
    return sorted({(d.name, KIND, fingerprint(d)) for d in definitions})
