"""The policy decides exactly as it did before the victim index (tests/reference_policy).

The victim index only changes how reclaim searches, never what it finds: on every cycle of
a slice of the Philly trace, of a scaled-down reclaim burst (benchmarks/reclaim_burst.py)
and of random snapshots, both give the same starts with their placements, preemptions,
reservation, held GPUs, and waits with their positions and reasons. The reference knows one
level of quotas and no moves (``consolidate``, off here); departments and moves are checked
against the contract in test_policy_properties.py (``quota_trees``, ``configs(moves=True)``),
in test_departments.py and test_policy_scenarios.py.
"""

from __future__ import annotations


import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import reference_policy
from jupyter_gpushare.policy import CycleResult, PolicyConfig, cycle
from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.trace import apportion, proportional_quotas, read_quotas, read_trace
from builders import burst_trace
from test_policy_properties import configs, full_pools, snapshots


def decisions(result: CycleResult) -> tuple:
    """Everything a cycle decides, in plain values (the reference has its own classes)."""
    def wait(w):
        return None if w is None else (w.job, w.position, repr(w.reason), w.reserved)

    return ([(s.job, dict(s.placement)) for s in result.starts],
            [(p.job, p.project, p.for_job, p.why, p.kind) for p in result.preemptions],
            dict(result.deserved), dict(result.usage), dict(result.held),
            wait(result.reservation), [wait(w) for w in result.unschedulable],
            [wait(w) for w in result.waits], tuple(result.within_quota_waiting))


class TwinSimulator(Simulator):
    """Decides every cycle with both policies and fails at the first difference."""

    cycles = preemptions = 0

    def decide(self, snap):
        ours = super().decide(snap)
        reference = reference_policy.cycle(snap, self.policy_config)
        assert decisions(ours) == decisions(reference), f"the cycle at t={snap.now} differs"
        self.cycles += 1
        self.preemptions += len(ours.preemptions)
        return ours


def test_a_slice_of_the_philly_trace_is_decided_as_before(philly):
    trace, quotas_csv = philly
    jobs = read_trace(trace)[:2000]
    # A small pool, so that the slice queues and reclaims as the whole trace does on 512 GPUs.
    quotas = apportion(read_quotas(quotas_csv), 128)
    sim = TwinSimulator(jobs, quotas, SimConfig(128, cycle_interval_s=10, policy_config=PolicyConfig(
        min_runtime_s=DEFAULT_MIN_RUNTIME_S, consolidate=False)))
    sim.run()
    assert sim.preemptions > 100, "the slice must exercise reclaim"


@pytest.mark.parametrize("fair", [False, True], ids=["guarantee", "fair-share-reclaim"])
def test_a_reclaim_burst_is_decided_as_before(tmp_path, fair):
    jobs = burst_trace(tmp_path, 600, 30)
    config = PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S, reclaim_fair_share=fair,
                          consolidate=False)
    sim = TwinSimulator(jobs, proportional_quotas(jobs, 240),
                        SimConfig(240, policy_config=config))
    sim.run()
    assert sim.preemptions > 20, "the burst must exercise reclaim"


@settings(max_examples=300, deadline=None)
@given(st.one_of(snapshots(two_levels=False), full_pools(), full_pools(young=True)), configs())
def test_any_snapshot_is_decided_as_before(snap, config):
    note(f"snapshot: {snap}")
    note(f"config: {config}")
    assert decisions(cycle(snap, config)) == decisions(reference_policy.cycle(snap, config))

