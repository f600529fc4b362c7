"""Benchmark 2: one scheduling cycle at scale.

1,000 nodes x 8 GPUs, 500 projects, the pool full and a backlog of 20,000 pending jobs,
kept at that size while jobs finish and arrive between cycles. For every cycle it times:
  ours      cycle() on a snapshot backed by the maintained queues (what the simulator and
            the service do),
  baseline  cycle() on the same state handed over as a plain tuple of jobs, which sorts
            and groups the whole backlog again,
  explain   reading result.waits: queue position and reason for every pending job,
and checks that ours and the baseline decide the same. Ratios are from the same run.

    .venv/bin/python benchmarks/cycle_scale.py [--cycles 60] [--nodes 1000] [--projects 500]
        [--backlog 20000] [--preset kai] [--departments N] [--no-consolidate]

``--departments N`` puts the projects in N departments (round-robin), each with its projects'
quotas and an even part of the 10 % of the pool no project's quota holds: two levels.

``--preset kai`` is the size KAI-Scheduler reports on (2.35 s a cycle at 4,000 nodes and
140,000 pods, in Go): 4,000 nodes x 8 GPUs, 2,000 projects, 100,000 pending jobs, 20 cycles.
"""

import argparse
import random
import time
from dataclasses import replace

from jupyter_gpushare.policy import GPU, JobState, Node, PolicyConfig, Project, Snapshot, cycle
from jupyter_gpushare.policy.model import TrainJob
from jupyter_gpushare.policy.queues import Queues
from jupyter_gpushare.sim.metrics import percentile
from jupyter_gpushare.sim.trace import apportion, departments_over

PRESETS = {"kai": {"nodes": 4000, "projects": 2000, "backlog": 100000, "cycles": 20}}
SIZES = [1] * 12 + [2] * 3 + [4] * 2 + [8] * 2 + [16]


def build(rng, n_nodes, n_projects, backlog, n_departments=0):
    nodes = tuple(Node(f"node-{i:04d}", 8) for i in range(n_nodes))
    names = [f"p{i:03d}" for i in range(n_projects)]
    quotas = apportion({p: rng.uniform(1, 10) for p in names}, int(n_nodes * 8 * 0.9))
    departments = departments_over(quotas, n_departments,
                                   n_nodes * 8 * GPU - sum(quotas.values())) \
        if n_departments else {}
    home = {p: d.name for d, group in departments.items() for p in group}
    projects = tuple(Project(p, quota=quotas[p], over_quota_weight=rng.choice([1, 1, 2, 3]),
                             priority=1 if i % 50 == 0 else 0, department=home.get(p, ""))
                     for i, p in enumerate(names))
    queues = Queues()
    serial = 0
    for node in nodes:  # fill every node
        left = 8
        while left:
            g = min(rng.choice([1, 1, 2, 4, 8]), left)
            left -= g
            serial += 1
            queues.put(TrainJob(f"r{serial}", rng.choice(names), g * GPU, submit_time=-1e5,
                                state=JobState.RUNNING, placement={node.name: g * GPU},
                                start_time=-rng.uniform(0, 1e5)))
    for _ in range(backlog):
        serial += 1
        queues.put(new_job(rng, names, serial, 0.0))
    return nodes, projects, names, queues, serial, tuple(departments)


def new_job(rng, names, serial, now):
    return TrainJob(f"j{serial}", rng.choice(names), rng.choice(SIZES) * GPU,
                    priority=rng.choice([0, 0, 0, 1]), submit_time=now - rng.uniform(0, 3600))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--projects", type=int, default=500)
    ap.add_argument("--backlog", type=int, default=20000)
    ap.add_argument("--departments", type=int, default=0,
                    help="put the projects in this many departments (0: one level)")
    ap.add_argument("--no-consolidate", action="store_true",
                    help="move no jobs within quota for gangs (default: as the pool, it may)")
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="a named size; options given as well override it")
    preset = ap.parse_known_args()[0].preset
    if preset:
        ap.set_defaults(**PRESETS[preset])
    args = ap.parse_args()
    rng = random.Random(1)
    wall = time.perf_counter()
    nodes, projects, names, queues, serial, departments = build(
        rng, args.nodes, args.projects, args.backlog, args.departments)
    config = PolicyConfig(min_runtime_s=60, consolidate=not args.no_consolidate)
    ours, base, explain, starts, preempts = [], [], [], 0, 0
    now = 0.0
    for _ in range(args.cycles):
        now += 10
        snap = Snapshot(now, nodes, projects, queues=queues, departments=departments)
        t = time.perf_counter()
        result = cycle(snap, config)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        waits = result.waits
        explain.append(time.perf_counter() - t)
        plain = Snapshot(now, nodes, projects, queues.jobs(), departments=departments)
        t = time.perf_counter()
        check = cycle(plain, config)
        base.append(time.perf_counter() - t)
        assert (check.starts, check.preemptions) == (result.starts, result.preemptions)
        assert len(waits) + len(result.starts) == sum(1 for j in queues.jobs() if j.pending)
        starts += len(result.starts)
        preempts += len(result.preemptions)
        # Apply the decisions; preempted jobs go back to the queue at once.
        for p in result.preemptions:
            queues.put(replace(queues.get(p.job), state=JobState.PENDING, placement={},
                               start_time=None, preempting=False))
        for s in result.starts:
            queues.put(replace(queues.get(s.job), state=JobState.RUNNING, placement=s.placement,
                               start_time=now, reserved=()))
        if result.reservation:
            queues.put(replace(queues.get(result.reservation.job),
                               reserved=result.reservation.reserved))
        running = [j for j in queues.jobs() if j.running]
        for job in rng.sample(running, len(running) // 100):  # 1 % finish every cycle
            queues.remove(job.id)
        pending = sum(1 for j in queues.jobs() if j.pending)
        for _ in range(args.backlog - pending):  # arrivals keep the backlog full
            serial += 1
            queues.put(new_job(rng, names, serial, now))
    wall = time.perf_counter() - wall

    def ms(values, q):
        return percentile([v * 1000 for v in values], q)

    level = f" in {len(departments)} departments" if departments else ""
    print(f"{args.nodes} nodes x 8 GPUs, {args.projects} projects{level}, backlog "
          f"{args.backlog:,}, {args.cycles} cycles: {starts:,} starts, {preempts:,} preemptions")
    print(f"{'':10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, values in (("ours", ours), ("baseline", base), ("explain", explain)):
        print(f"{name:10}{ms(values, 50):>10.1f}{ms(values, 99):>10.1f}{ms(values, 100):>10.1f}")
    print(f"ours vs baseline: {ms(base, 50) / ms(ours, 50):.1f}x faster at p50, "
          f"{ms(base, 99) / ms(ours, 99):.1f}x at p99; decisions identical in every cycle")
    steady = ours[1:]
    print(f"the first cycle reclaims for every project the random start left below its quota "
          f"({ours[0] * 1000:.1f} ms); the {len(steady)} after it: p50 {ms(steady, 50):.1f} ms, "
          f"p99 {ms(steady, 99):.1f} ms")
    print(f"whole run: {wall:.1f} s wall")


if __name__ == "__main__":
    main()
