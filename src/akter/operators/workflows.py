"""Workflow runs for operators: by id (status, journal, signal, cancel, retry) and in lists.

:class:`Workflows` is the engine's run view (the one every in-process
:class:`~akter.workflows.WorkflowRun` uses), named here with the values it answers in; the HTTP
routes, the CLI (``akter workflows``) and the console reach it as ``runtime.workflows``.
"""

from __future__ import annotations

from akter._engine.workflows.ops import ENDED, RunDetail, RunLocation, RunSummary, SignalView
from akter._engine.workflows.ops import WorkflowOps as Workflows

__all__ = ["ENDED", "RunDetail", "RunLocation", "RunSummary", "SignalView", "Workflows"]
