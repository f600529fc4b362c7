"""What a simulation is asked to run: the pool's size and the policy's settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..policy import PolicyConfig
from ..policy.past_use import FairShareTime
from ..policy.settings import DEFAULT_GRACE_S


@dataclass(frozen=True)
class SimConfig:
    capacity_gpus: int
    gpus_per_node: int = 8
    policy: str = "guaranteed"
    grace_s: float = DEFAULT_GRACE_S
    checkpoint_interval_s: float = 1800.0
    cycle_interval_s: float = 0.0
    """Least time between two cycles; 0 runs one after every instant at which something changed."""
    cycle_delay_s: float = 0.0
    """Seconds from a change (a submit, an end) to the cycle it brings: 0 for a trace; a
    replay of the pool's history gives the pool's measured decision latency, so that its
    starts do not drift ahead of the recorded ones job after job."""
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    fair_share: FairShareTime | None = None
    """Fair share over time (policy/past_use.py): off when None, as in the service."""
    activity: str | None = None
    """The profile (``activity.PROFILES``) each job's utilization is drawn from where the
    trace gives none; None: only the trace's ``util`` is used, and a job without one has no
    activity modelled (``JobRecord.util`` None)."""
    activity_seed: int = 0
    idle_first: bool = True
    """Flag jobs idle for ``activity.IDLE_JOB_AFTER_S`` as idle, as the pool's
    ``reclaim_idle_first`` does, so that reclaim takes them first."""
