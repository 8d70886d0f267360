"""What a runner's code declares per actor type, recorded so that other code can tell "newer".

During a rolling deploy two versions of the code run side by side (evolution E4), and each must
tell data the other version wrote from data that is really wrong for it:

- A deploy that only adds defaulted fields keeps the state version (evolution EVO-01), so a row
  it writes carries keys an older model would drop on its next write (the loss guard). The
  deployment's name registry gets, once per model, the kind ``state`` and the model's
  fingerprint (its state version and declared key paths) when the model is first recorded: the
  earlier record is the older model. A row whose dropped keys a live runner's newer model
  declares, at the row's state version, is refused with ``StateTooNew``
  (``akter._engine.turn.too_new``); any other loss keeps the guard's ``Defect``.
- A deploy that adds a command may stage intents to it before the older runners are gone. An
  older relay that claims one leaves it due for a runner that declares the command while one is
  live (``Relay``), and parks it otherwise.

Each runner's registry row records, per hosted type, its state version, model fingerprint,
declared state key paths and commands (``runners.models``, migration 0014).
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


def models(definitions: Iterable[ActorDefinition]) -> dict[str, dict[str, Any]]:
    """Per type: state version, fingerprint, state key paths, commands and jobs (a runner's row).

    The commands and jobs include the aliases this code delivers under their current name.
    """
    return {
        d.name: {
            "version": d.state_version,
            "model": fingerprint(d),
            "paths": sorted(declared_paths(d.state_model)),
            "commands": sorted(
                {m.name for m in d.members.values() if m.kind == "command"}
                | {a for a, n in d.aliases.items() if n in d.members}
            ),
            "jobs": sorted(set(d.jobs) | {a for a, n in d.aliases.items() if n in d.jobs}),
        }
        for d in definitions
    }


def names(definitions: Iterable[ActorDefinition]) -> list[tuple[str, str, str]]:
    """The ``(type, "state", fingerprint)`` names to record at start (the first record stays)."""
    return sorted({(d.name, KIND, fingerprint(d)) for d in definitions})
