"""How log lines name their subject in the text itself (an actor, a job attempt, a run).

A plain log line must say what failed without its ``extra`` fields: the same identities go to
``extra=`` for structured handlers, and into the message through these labels.
"""

from __future__ import annotations

DEFAULT_TENANT = "default"


def actor_label(tenant: str, actor_type: str, actor_id: str) -> str:
    """``Order/'o-1'``; the tenant is named when it is not the default one."""
    label = f"{actor_type}/{actor_id!r}"
    return label if tenant == DEFAULT_TENANT else f"{label} of tenant {tenant!r}"


def job_label(tenant: str, actor_type: str, actor_id: str, job: str, job_id: str) -> str:
    """``job charge of Order/'o-1' (job id '…')``."""
    return f"job {job} of {actor_label(tenant, actor_type, actor_id)} (job id {job_id!r})"


def run_label(tenant: str, actor_type: str, actor_id: str, workflow: str, run_id: str) -> str:
    """``workflow run checkout of Order/'o-1' (run id '…')``."""
    return f"workflow {workflow} of {actor_label(tenant, actor_type, actor_id)} (run id {run_id!r})"
