"""What decides: the pool's scheduling settings as one frozen object, built once from the
service's options (``PoolService``), read by its scheduling loop, sent whole in
``api/history`` and read back by a replay of that history (``sim/history.py``: the what-if,
``gpushare simulate --from-pool``), so that a replay decides as the pool did.

Defaults are written here once; the service's options, the simulator's command line and a
replay of an older pool's history (whose answer lacks a field) take them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import DEFAULT_MIN_RUNTIME_S, PolicyConfig
from .past_use import FairShareTime

DEFAULT_GRACE_S = 30.0
"""Seconds a preempted or cancelled job gets between SIGTERM and SIGKILL (to checkpoint)."""
DEFAULT_CYCLE_S = 1.0
"""Seconds between the service's idle scheduling cycles (a submit or an end runs one at once)."""
DEFAULT_FAIR_SHARE_WINDOW_S = 7 * 86400.0
"""Seconds of borrowed GPU-time fair share over time looks back on."""

# PolicyConfig's knobs that the service sets (the others are for baselines of the simulator).
_POLICY = ("min_runtime_s", "reserve_after_s", "preempt_within_project", "reclaim_fair_share",
           "consolidate")


@dataclass(frozen=True)
class PoolSettings:
    """Everything the pool's scheduling decisions depend on beyond its state (nodes,
    projects, departments, jobs). Times are seconds."""

    cycle_interval_s: float = DEFAULT_CYCLE_S
    grace_period_s: float = DEFAULT_GRACE_S
    policy: PolicyConfig = field(
        default_factory=lambda: PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S))
    fair_share: FairShareTime | None = None
    """Fair share over time; None: off."""
    lend_build_gpus: bool = False
    """Whole build GPUs without slices lent to train jobs (a replay has no build pool)."""

    def to_json(self) -> dict:
        """The settings as ``api/history`` sends them (flat, seconds)."""
        out = {"cycle_interval_s": self.cycle_interval_s,
               "grace_period_s": self.grace_period_s,
               **{name: getattr(self.policy, name) for name in _POLICY},
               "fair_share_half_life_s": self.fair_share.half_life_s if self.fair_share else 0.0,
               "fair_share_window_s": self.fair_share.window_s if self.fair_share
               else DEFAULT_FAIR_SHARE_WINDOW_S,
               "lend_build_gpus": self.lend_build_gpus}
        return out

    @classmethod
    def from_json(cls, knobs: dict) -> PoolSettings:
        """The settings ``to_json`` gave; a field an older pool did not send keeps the default
        of that pool's time (a minimum runtime of 0, as before the default was 30 s).
        ``ValueError`` for a value of the wrong kind."""
        base = PolicyConfig()

        def number(name, default):
            value = knobs.get(name, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"the pool's setting {name} must be 0 or more seconds, "
                                 f"not {value!r}")
            return float(value)

        def flag(name, default):
            value = knobs.get(name, default)
            if not isinstance(value, bool):
                raise ValueError(f"the pool's setting {name} must be true or false, "
                                 f"not {value!r}")
            return value

        policy = PolicyConfig(
            min_runtime_s=number("min_runtime_s", 0.0),
            reserve_after_s=number("reserve_after_s", base.reserve_after_s),
            preempt_within_project=flag("preempt_within_project", base.preempt_within_project),
            reclaim_fair_share=flag("reclaim_fair_share", base.reclaim_fair_share),
            consolidate=flag("consolidate", base.consolidate))
        half_life = number("fair_share_half_life_s", 0.0)
        fair_share = FairShareTime(half_life, number("fair_share_window_s",
                                                     DEFAULT_FAIR_SHARE_WINDOW_S)) \
            if half_life else None
        return cls(cycle_interval_s=number("cycle_interval_s", DEFAULT_CYCLE_S),
                   grace_period_s=number("grace_period_s", DEFAULT_GRACE_S), policy=policy,
                   fair_share=fair_share,
                   lend_build_gpus=flag("lend_build_gpus", False))


