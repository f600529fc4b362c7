"""The simulator's parts: each class holds one concern (no more than 20 instance attributes);
a cycle the simulator spares, one that could decide nothing new, changes no figure; and an
attempt's end is the service's rule (``policy.outcome.after_attempt``)."""

from __future__ import annotations

import ast
import io
from dataclasses import replace
from pathlib import Path

import pytest
from builders import burst_trace

from jupyter_gpushare.policy.lending import lent_node
from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S, GPU, Department, Node, PolicyConfig
from jupyter_gpushare.policy.outcome import KILLED, REQUEUED, after_attempt
from jupyter_gpushare.policy.past_use import FairShareTime
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.metrics import summarize
from jupyter_gpushare.sim.team import TeamParameters, load_jobs, make_team
from jupyter_gpushare.sim.team_run import TeamRun
from jupyter_gpushare.sim.trace import proportional_quotas, read_quotas, read_trace
from jupyter_gpushare.trainjob import CANCELLED, FAILED, PENDING, PREEMPTED, SUCCEEDED

SIM = Path(__file__).resolve().parents[1] / "jupyter_gpushare" / "sim"
MOST = 20


class EveryCycleSimulator(Simulator):
    """Decides every cycle it runs, even one that could decide nothing new."""

    def _unchanged(self, t, snap):
        return None


def test_the_simulator_and_its_parts_each_hold_few_attributes(example):
    sim = Simulator(read_trace(example[0]), read_quotas(example[1]),
                    SimConfig(32, fair_share=FairShareTime(86400.0), activity="philly"),
                    events=io.StringIO(), timeline=True, spans=True)
    sim.run()
    parts = {"Simulator": sim, "EventClock": sim.clock, "ClusterState": sim.cluster,
             "MetricsObserver": sim.metrics, "Borrowing": sim.borrowing}
    p = TeamParameters(weeks=1)
    team = TeamRun(p, make_team(p), load_jobs(), "gpushare", 1.0, "philly")
    team.run()
    parts.update(TeamRun=team, BuildSessions=team.build)
    held = {name: len(vars(part)) for name, part in parts.items()}
    assert max(held.values()) <= MOST, held


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """What a class's methods assign to ``self``, and a dataclass's fields."""
    names = {s.target.id for s in cls.body
             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id == "self":
                    names.add(t.attr)
    return names


def _frozen(cls: ast.ClassDef) -> bool:
    return any(isinstance(d, ast.Call) and any(k.arg == "frozen" for k in d.keywords)
               for d in cls.decorator_list)


def test_no_class_of_the_simulator_holds_more_than_twenty_attributes():
    """Frozen dataclasses are left out: they are settings, read and never changed
    (``TeamParameters`` is every parameter of the team model, each documented)."""
    over = {}
    for path in sorted(SIM.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not _frozen(node):
                count = len(_instance_attributes(node))
                if count > MOST:
                    over[f"{path.name}:{node.name}"] = count
    assert not over, over


def _figures(cls, jobs, quotas, config, **kw):
    events = io.StringIO()
    run = cls(jobs, quotas, config, events=events, timeline=True, **kw).run()
    summary = summarize(run)
    cycles = summary.pop("cycles")
    for key in ("decision_ms", "wall_s"):
        summary.pop(key)
    return (summary, events.getvalue(), run.timeline, sorted(run.guarantee_wait_s),
            sorted(run.reclaim_s)), cycles


CONFIGS = {
    "minimum runtime": SimConfig(240, policy_config=PolicyConfig(
        min_runtime_s=DEFAULT_MIN_RUNTIME_S)),
    "no moves, reservations after 2 minutes": SimConfig(240, policy_config=PolicyConfig(
        min_runtime_s=DEFAULT_MIN_RUNTIME_S, consolidate=False, reserve_after_s=120.0)),
    "fair-share reclaim, 10 s cycles": SimConfig(240, cycle_interval_s=10.0,
                                                 policy_config=PolicyConfig(
        min_runtime_s=60.0, reclaim_fair_share=True)),
    "fair share over time, cycles 2 s after a change": SimConfig(
        240, cycle_delay_s=2.0, fair_share=FairShareTime(3600.0, 86400.0),
        policy_config=PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S)),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_a_spared_cycle_changes_no_figure(tmp_path, name):
    jobs = burst_trace(tmp_path, 600, 30)
    quotas = proportional_quotas(jobs, 240)
    spared, fewer = _figures(Simulator, jobs, quotas, CONFIGS[name])
    every, cycles = _figures(EveryCycleSimulator, jobs, quotas, CONFIGS[name])
    assert spared == every
    assert spared[0]["preemptions"] > 20, "the burst must exercise reclaim"
    if CONFIGS[name].fair_share is None:  # else the decayed past moves between cycles
        assert fewer < cycles


def test_a_spared_cycle_changes_nothing_with_departments_and_lent_gpus(example):
    jobs = read_trace(example[0])
    quotas = read_quotas(example[1])
    config = SimConfig(32, policy_config=PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S))
    departments = {Department("all", sum(quotas.values())): tuple(quotas)}
    own = tuple(Node(f"n{i}", 8) for i in range(3))
    out = []
    for cls in (Simulator, EveryCycleSimulator):
        sim = cls(jobs, quotas, config, events=io.StringIO(), departments=departments,
                  nodes=own + (Node(lent_node("b0"), 8, lent=True),))

        def lend(gpus, sim=sim):  # the build pool takes lent GPUs back, then lends again
            def change(t):
                sim.nodes = own + (Node(lent_node("b0"), gpus, lent=True),)
                sim.changed(t)
            return change
        for t, gpus in ((12_000.0, 2), (30_000.0, 8), (50_000.0, 0), (80_000.0, 8)):
            sim.at(t, lend(gpus))
        run = sim.run()
        out.append((sim.metrics.out.getvalue(), replace(run, wall_s=0, decision_s=[])))
    assert out[0] == out[1]
    assert '"take back"' in out[0][0]


# (how the backend read the end, exit code, vanished, being stopped, being cancelled) → outcome
ENDS = [
    (SUCCEEDED, 0, False, False, False, SUCCEEDED),
    (FAILED, 1, False, False, False, FAILED),
    (FAILED, 143, False, False, False, FAILED),  # killed by someone else: it failed
    (FAILED, None, True, False, False, PENDING),  # vanished: run again
    (SUCCEEDED, 0, False, True, False, SUCCEEDED),  # its work ended within the grace
    (FAILED, 143, False, True, False, PREEMPTED),
    (FAILED, KILLED, False, True, False, PREEMPTED),
    (FAILED, None, False, True, False, PREEMPTED),  # no status recorded
    (FAILED, 1, False, True, False, FAILED),  # it failed by itself meanwhile
    (FAILED, None, True, True, False, PREEMPTED),
    (SUCCEEDED, 0, False, False, True, CANCELLED),
    (FAILED, KILLED, False, True, True, CANCELLED),
]


@pytest.mark.parametrize("ended, code, vanished, stopping, cancelling, outcome", ENDS)
def test_what_a_job_does_after_an_attempt(ended, code, vanished, stopping, cancelling, outcome):
    assert after_attempt(ended, code, vanished=vanished, stopping=stopping,
                         cancelling=cancelling) == outcome
    assert (outcome in REQUEUED) == (outcome in (PREEMPTED, PENDING))


def test_a_preempted_job_is_requeued_only_when_the_grace_ends_it():
    """The simulator asks ``after_attempt``: a job whose work ends within its grace has
    finished; one still running when the grace ends is requeued."""
    from jupyter_gpushare.sim.trace import TraceJob

    jobs = [TraceJob("a", 0, 100, 2 * GPU, "a"), TraceJob("b", 0, 10_000, 2 * GPU, "a"),
            TraceJob("c", 80, 500, 4 * GPU, "c")]
    run = Simulator(jobs, {"a": 0, "c": 4 * GPU}, SimConfig(
        4, gpus_per_node=4, grace_s=30.0, policy_config=PolicyConfig(min_runtime_s=0))).run()
    a, b = run.records["a"], run.records["b"]
    assert a.preemptions == b.preemptions == 1
    assert a.finished_while_preempted and a.finish == 100 and a.attempt == 1
    assert not b.finished_while_preempted and b.attempt == 2 and b.finish is not None
