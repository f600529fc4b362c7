"""The policies a simulation can run: ours and the two baselines it is measured against.

All three drive the same ``policy.cycle``; a baseline is only a different set of projects
and knobs, so a difference in the figures comes from the policy, not from other code.

- ``guaranteed``: per-project guaranteed quotas, borrowing of idle GPUs, reclaim by preemption.
- ``static``: each project confined to its quota (its quota is its limit), no borrowing and no
  preemption: today's static allocation. A job larger than its project's quota never runs.
- ``fifo``: one queue, no quotas, no preemption and no reservations: plain Kubernetes.
"""

from __future__ import annotations

from dataclasses import replace

from ..policy.model import PolicyConfig, Project

POLICIES = ("guaranteed", "static", "fifo")
FIFO_QUEUE = "(all)"


def projects_for(policy: str, quotas: dict[str, int]) -> tuple[Project, ...]:
    if policy == "guaranteed":
        return tuple(Project(name, quota=q) for name, q in sorted(quotas.items()))
    if policy == "static":
        return tuple(Project(name, quota=q, limit=q, over_quota_weight=0)
                     for name, q in sorted(quotas.items()))
    if policy == "fifo":
        return (Project(FIFO_QUEUE),)
    raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


def config_for(policy: str, base: PolicyConfig) -> PolicyConfig:
    if policy == "guaranteed":
        return base
    return replace(base, preemption=False, reservations=False, reclaim_fair_share=False,
                   preempt_within_project=False, consolidate=False)


def queue_of(policy: str, project: str) -> str:
    """The policy project a trace project's jobs go to."""
    return FIFO_QUEUE if policy == "fifo" else project
