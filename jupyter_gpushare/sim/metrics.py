"""The figures of a simulation run, as the ``--json`` object of ``gpushare simulate``."""

from __future__ import annotations

from ..policy.model import GPU
from .engine import SimConfig, SimRun


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(min(rank, len(ordered))) - 1]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def guarantee_bound(cfg: SimConfig) -> float:
    """The guarantee's bound in a simulation (docs/explanation/scheduling.md, "The guarantee's
    bound"): the minimum runtime, a cycle to claim the GPUs once victims may go, the grace
    period, and a cycle to start once they are gone. The service runs that last cycle at once
    (it polls for ended jobs every 0.1 s); the simulator waits out ``cycle_interval_s``."""
    cycle = cfg.cycle_interval_s + cfg.cycle_delay_s
    return round(cfg.policy_config.min_runtime_s + cfg.grace_s + 2 * cycle, 3)


def fair_targets(total: float, weights: dict[str, float], caps: dict[str, float]) -> dict[str, float]:
    """Divide ``total`` by ``weights``, none beyond its cap; what a capped project leaves
    goes to the others by weight (water-filling)."""
    target = dict.fromkeys(weights, 0.0)
    open_ = {p for p in weights if weights[p] > 0 and caps.get(p, 0.0) > 0}
    left = total
    while open_ and left > 1e-9:
        w = sum(weights[p] for p in open_)
        capped = {p for p in open_ if target[p] + left * weights[p] / w >= caps[p]}
        if not capped:
            for p in open_:
                target[p] += left * weights[p] / w
            break
        for p in capped:
            left -= caps[p] - target[p]
            target[p] = caps[p]
        open_ -= capped
    return target


def borrow_gaps(run: SimRun) -> list[dict]:
    """Per week, how far borrowing was from the projects' weights: among the projects that
    wanted to borrow that week, the largest gap between a project's share of the week's
    borrowed GPU-hours and its fair share of them, by weight and capped by what it wanted
    (docs/explanation/scheduling.md, "Fair share over time")."""
    weeks = []
    for week in sorted(run.wanted_s):
        wanted = {p: w for p, w in run.wanted_s[week].items() if w > 0}
        borrowed = run.borrowed_s.get(week, {})
        total = sum(borrowed.get(p, 0.0) for p in wanted)
        if len(wanted) < 2 or total <= 0:
            continue
        target = fair_targets(total, {p: run.weights.get(p, 1) for p in wanted}, wanted)
        gaps = {p: (borrowed.get(p, 0.0) - target[p]) / total for p in wanted}
        worst = max(gaps, key=lambda p: abs(gaps[p]))
        weeks.append({"week": week, "projects": len(wanted),
                      "borrowed_gpu_hours": round(total / 3600, 1),
                      "gap": round(abs(gaps[worst]), 4), "project": worst})
    return weeks


def activity_figures(run: SimRun, span: float) -> dict:
    """Average GPU utilization over the run (utilized GPU-seconds ÷ (capacity × span)), of
    what was allocated, and the idle-allocated share (docs/explanation/utilization.md);
    None where no job's activity was modelled."""
    recs = [r for r in run.records.values() if r.util is not None]
    modelled = sum(r.allocated_gpu_s for r in recs)
    utilized = sum(r.utilized_gpu_s for r in recs)
    on = bool(recs) and modelled > 0 and span > 0
    return {
        "activity": run.config.activity,
        "jobs_with_util": sum(1 for r in run.records.values() if r.trace.util is not None),
        "avg_utilization": round(utilized / (run.config.capacity_gpus * span), 4) if on else None,
        "utilization": round(utilized / modelled, 4) if on else None,
        "idle_allocated": round(sum(r.idle_gpu_s for r in recs) / modelled, 4) if on else None,
    }


def _to_last_submit(run: SimRun) -> float:
    """Allocation from the first submit to the last: the whole run's ``allocation`` also
    counts the drain after the last submit, whose length one late job's end decides (on
    Philly: 109 or 118 days for the same GPU-hours, 73 or 68 %)."""
    span = run.last_submit - run.start
    if span <= 0:
        return 0.0
    return round(run.gpu_s_to_last_submit / (run.config.capacity_gpus * span), 4)


def summarize(run: SimRun) -> dict:
    cfg = run.config
    recs = list(run.records.values())
    done = [r for r in recs if r.finish is not None]
    span = max(run.end - run.start, 0.0)
    allocated = sum(r.allocated_gpu_s for r in recs)
    jct = [r.finish - r.trace.submit_time for r in done]
    queued = [r.queued_s for r in done]
    decisions = [d * 1000 for d in run.decision_s]
    gaps = borrow_gaps(run)
    per_project = {}
    for name in sorted({r.trace.project for r in recs}):
        mine = [r for r in recs if r.trace.project == name]
        fin = [r for r in mine if r.finish is not None]
        per_project[name] = {
            "quota_gpus": run.quotas.get(name, 0) / GPU,
            "jobs": len(mine),
            "completed": len(fin),
            "unschedulable": sum(1 for r in mine if r.unschedulable),
            "gpu_hours": round(sum(r.allocated_gpu_s for r in mine) / 3600, 2),
            "avg_jct_s": round(_mean([r.finish - r.trace.submit_time for r in fin]), 1),
            "avg_queue_s": round(_mean([r.queued_s for r in fin]), 1),
            "p99_queue_s": round(percentile([r.queued_s for r in fin], 99), 1),
            "preemptions": sum(r.preemptions for r in mine),
            "lost_gpu_hours": round(sum(r.lost_gpu_s for r in mine) / 3600, 2),
        }
    departments = {}
    for dept, names in run.departments.items():
        mine = [r for r in recs if r.trace.project in names]
        held = sum(r.allocated_gpu_s for r in mine)
        departments[dept.name] = {
            "quota_gpus": dept.quota / GPU,
            "limit_gpus": None if dept.limit is None else dept.limit / GPU,
            "over_quota_weight": dept.over_quota_weight,
            "projects": list(names),
            "jobs": len(mine),
            "gpu_hours": round(held / 3600, 2),
            "avg_allocated_gpus": round(held / span, 2) if span else 0.0,
            "avg_queue_s": round(_mean([r.queued_s for r in mine if r.finish is not None]), 1),
            "preemptions": sum(r.preemptions for r in mine),
        }
    return {
        "policy": cfg.policy,
        "capacity_gpus": cfg.capacity_gpus,
        "gpus_per_node": cfg.gpus_per_node,
        "jobs": len(recs),
        "completed": len(done),
        "unschedulable": sum(1 for r in recs if r.unschedulable),
        "span_s": round(span, 1),
        "allocation": round(allocated / (cfg.capacity_gpus * span), 4) if span else 0.0,
        "allocation_to_last_submit": _to_last_submit(run),
        **activity_figures(run, span),
        "avg_jct_s": round(_mean(jct), 1),
        "p50_jct_s": round(percentile(jct, 50), 1),
        "p99_jct_s": round(percentile(jct, 99), 1),
        "avg_queue_s": round(_mean(queued), 1),
        "p99_queue_s": round(percentile(queued, 99), 1),
        "preemptions": sum(r.preemptions for r in recs),
        "preemptions_under_60s": sum(r.young_preemptions for r in recs),
        "finished_while_preempted": sum(r.finished_while_preempted for r in recs),
        "lost_gpu_hours": round(sum(r.lost_gpu_s for r in recs) / 3600, 2),
        "within_quota_preemptions": run.within_quota_preemptions,
        "moves": run.moves,
        "p99_reclaim_s": round(percentile(run.reclaim_s, 99), 1),
        "reclaims": len(run.reclaim_s),
        "guarantee_bound_s": guarantee_bound(cfg),
        "guarantee_wait_p99_s": round(percentile(run.guarantee_wait_s, 99), 1),
        "guarantee_wait_max_s": round(max(run.guarantee_wait_s, default=0.0), 1),
        "guarantee_waits": len(run.guarantee_wait_s),
        "guarantee_waits_over_bound": sum(w > guarantee_bound(cfg)
                                          for w in run.guarantee_wait_s),
        "fair_share_half_life_s": cfg.fair_share.half_life_s if cfg.fair_share else None,
        "reclaim_fair_share": cfg.policy_config.reclaim_fair_share,
        "consolidate": cfg.policy == "guaranteed" and cfg.policy_config.consolidate,
        "borrow_gap_max": max((w["gap"] for w in gaps), default=0.0),
        "borrow_gap_mean": round(_mean([w["gap"] for w in gaps]), 4),
        "borrow_gap_weeks": gaps,
        "cycles": len(decisions),
        "decision_ms": {"p50": round(percentile(decisions, 50), 3),
                        "p99": round(percentile(decisions, 99), 3),
                        "max": round(max(decisions, default=0.0), 3)},
        "wall_s": round(run.wall_s, 2),
        "grace_s": cfg.grace_s,
        "checkpoint_interval_s": cfg.checkpoint_interval_s,
        "per_project": per_project,
        "departments": departments,
    }
