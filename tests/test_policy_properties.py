"""Properties of the scheduling contract on random clusters, projects and job streams.

A random world is driven through many cycles the way the service drives the policy
(``builders.apply``): jobs finish after their run time, preempted jobs release their GPUs
after a grace of one cycle and are requeued, unless their run time ended within that grace:
then they exited 0 by themselves and have finished, never to run again (contract 9,
``policy/outcome.py``). Every cycle is checked against the scheduling contract
(docs/explanation/scheduling.md); the checks use their own brute-force arithmetic, never the
policy's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from itertools import combinations

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from builders import GPU, apply, finish
from jupyter_gpushare.policy import (CycleResult, JobState, Node, PolicyConfig, Project, Snapshot,
                                     TrainJob, cycle)
from jupyter_gpushare.policy.model import Department
from jupyter_gpushare.policy import reasons as R
from jupyter_gpushare.policy.outcome import SUCCEEDED, after_stop
from jupyter_gpushare.policy.queues import queue_key

DT = 10.0  # seconds between cycles; the grace period is one cycle
# GPUSHARE_EXAMPLES=5000 runs each property on more examples (the suite uses 150).
SETTINGS = settings(max_examples=int(os.environ.get("GPUSHARE_EXAMPLES", 150)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# -- random worlds ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Arrival:
    step: int
    job: TrainJob
    duration: int | None  # cycles of run time per attempt; None runs until the end


@dataclass(frozen=True)
class World:
    nodes: tuple[Node, ...]
    projects: tuple[Project, ...]
    arrivals: tuple[Arrival, ...]  # an arrival at step 0 may already run (it was placed before)
    config: PolicyConfig
    departments: tuple[Department, ...] = ()


@st.composite
def worlds(draw, max_jobs=20, arrive_until=12, finite=True):
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    capacity, biggest = sum(sizes), max(sizes)
    projects, departments = draw(quota_trees(capacity))
    arrivals = []
    if draw(st.booleans()):  # jobs placed before: by another policy, or before quotas changed
        for node, size in enumerate(sizes):
            free = size
            for gpus in draw(st.lists(st.integers(1, size), max_size=4)):
                if gpus > free:
                    break
                free -= gpus
                duration = draw(st.one_of(st.none(), st.integers(1, 12))) if finite else None
                since = -DT * draw(st.integers(0, 5))
                job = TrainJob(f"r{len(arrivals)}", draw(st.sampled_from(projects)).name,
                               gpus * GPU, priority=draw(st.integers(0, 2)), submit_time=since,
                               state=JobState.RUNNING, placement={f"n{node}": gpus * GPU},
                               start_time=since, idle=draw(st.booleans()))
                arrivals.append(Arrival(0, job, duration))
    for i in range(draw(st.integers(1, max_jobs))):
        gpus = draw(st.one_of(st.integers(1, biggest), st.integers(1, capacity + 1)))
        step = draw(st.integers(0, arrive_until))
        duration = draw(st.one_of(st.none(), st.integers(1, 8))) if finite else None
        job = TrainJob(f"j{i}", draw(st.sampled_from(projects)).name, gpus * GPU,
                       priority=draw(st.integers(0, 2)), submit_time=step * DT,
                       idle=draw(st.booleans()))  # idle once it runs (GPUs measured unused)
        arrivals.append(Arrival(step, job, duration))
    nodes = tuple(Node(f"n{i}", g) for i, g in enumerate(sizes))
    return World(nodes, tuple(projects), tuple(arrivals), draw(configs(moves=True)), departments)


@st.composite
def project_lists(draw, capacity):
    """1–4 projects whose quotas together fit the pool."""
    projects, left = [], capacity
    for i in range(draw(st.integers(1, 4))):
        quota = draw(st.integers(0, left))
        left -= quota
        limit = draw(st.one_of(st.none(), st.integers(quota, capacity + 2)))
        projects.append(Project(f"p{i}", quota * GPU, draw(st.integers(0, 3)),
                                None if limit is None else limit * GPU, draw(st.integers(0, 2))))
    return projects


@st.composite
def quota_trees(draw, capacity):
    """``project_lists``, perhaps in two levels: 0-2 departments over some of the projects,
    each with a quota that holds its projects' quotas and fits the pool with the rest, and
    perhaps a limit."""
    projects = draw(project_lists(capacity))
    count = draw(st.sampled_from([0, 0, 1, 2]))
    if not count:
        return projects, ()
    homes = [draw(st.sampled_from([None] + [f"d{k}" for k in range(count)])) for _ in projects]
    projects = [replace(p, department=home or "") for p, home in zip(projects, homes)]
    left = capacity - sum(p.quota for p in projects) // GPU
    departments = []
    for k in range(count):
        name = f"d{k}"
        held = sum(p.quota for p in projects if p.department == name) // GPU
        quota = held + draw(st.integers(0, left))
        left -= quota - held
        limit = draw(st.one_of(st.none(), st.integers(quota, capacity + 2)))
        departments.append(Department(name, quota * GPU, draw(st.integers(0, 3)),
                                      None if limit is None else limit * GPU))
    return projects, tuple(departments)


def configs(moves=False):
    """Policy configurations; with ``moves``, perhaps ``consolidate`` too (the reference
    policy of test_policy_equality.py knows no moves)."""
    return st.builds(PolicyConfig,
                     consolidate=st.booleans() if moves else st.just(False),
                     min_runtime_s=st.sampled_from([0.0, 0.0, 15.0, 40.0]),
                     reserve_after_s=st.sampled_from([20.0, 50.0, 1800.0]),
                     reclaim_fair_share=st.booleans(),
                     preempt_within_project=st.booleans(),
                     reservations=st.booleans())


@st.composite
def snapshots(draw, now=100.0, two_levels=True):
    """Any state a cycle may meet: jobs placed anywhere (by an earlier policy, before quotas
    changed), some being preempted, one perhaps holding a reservation; perhaps departments
    over the projects (unless not ``two_levels``)."""
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    capacity = sum(sizes)
    projects, departments = draw(quota_trees(capacity)) if two_levels else \
        (draw(project_lists(capacity)), ())
    names = [p.name for p in projects]
    jobs, free = [], {f"n{i}": g for i, g in enumerate(sizes)}
    for node, size in list(free.items()):  # mostly full nodes of small jobs: contention
        for gpus in draw(st.lists(st.integers(1, max(1, size // 2)), max_size=6)):
            if gpus > free[node]:
                break
            free[node] -= gpus
            jobs.append({node: gpus})
    if draw(st.booleans()):  # a gang across two nodes, taking what is left there
        spare = [n for n in free if free[n]]
        if len(spare) >= 2:
            a, b = draw(st.lists(st.sampled_from(spare), min_size=2, max_size=2, unique=True))
            jobs.append({a: free[a], b: free[b]})
            free[a] = free[b] = 0
    out = []
    for i, placement in enumerate(jobs):
        since = now - draw(st.sampled_from([0.0, 10.0, 30.0, 100.0]))
        out.append(TrainJob(f"r{i}", draw(st.sampled_from(names)),
                            sum(placement.values()) * GPU, priority=draw(st.integers(0, 2)),
                            submit_time=since, state=JobState.RUNNING,
                            placement={n: g * GPU for n, g in placement.items()},
                            start_time=since, preempting=draw(st.integers(0, 9)) == 0,
                            idle=draw(st.booleans())))
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.one_of(st.integers(1, max(sizes)), st.integers(1, capacity + 1)))
        out.append(TrainJob(f"q{i}", draw(st.sampled_from(names)), gpus * GPU,
                            priority=draw(st.integers(0, 2)),
                            submit_time=now - draw(st.sampled_from([0.0, 10.0, 60.0]))))
    if draw(st.booleans()):
        i = draw(st.integers(len(jobs), len(out) - 1))
        held = draw(st.lists(st.sampled_from(sorted(free)), min_size=1, unique=True))
        out[i] = replace(out[i], reserved=tuple(sorted(held)))
    nodes = tuple(Node(f"n{i}", g) for i, g in enumerate(sizes))
    return Snapshot(now, nodes, tuple(projects), tuple(out), departments=departments)


@st.composite
def full_pools(draw, now=100.0, young=False):
    """A full pool of small jobs of three projects and a claimant ``z`` within its quota.

    Quotas fit the pool, so the others run at least the claimant's gang beyond their quotas;
    whether it can be made room for on few enough nodes depends on where their jobs lie.
    """
    size, count = draw(st.integers(2, 8)), draw(st.integers(2, 5))
    jobs, usage = [], {"x": 0, "y": 0, "w": 0}
    for node in range(count):
        left = size
        while left:
            gpus = min(left, draw(st.integers(1, max(1, size // 2))))
            left -= gpus
            project = draw(st.sampled_from(sorted(usage)))
            usage[project] += gpus
            since = now if young else now - draw(st.sampled_from([10.0, 20.0, 30.0, 40.0,
                                                                  50.0]))
            jobs.append(TrainJob(f"r{len(jobs)}", project, gpus * GPU, submit_time=since,
                                 state=JobState.RUNNING, placement={f"n{node}": gpus * GPU},
                                 start_time=since, idle=draw(st.booleans())))
    gpus = draw(st.integers(1, 2 * size))
    # young: every running job just started, and they all borrow (quota 0), so that a
    # requeued victim never keeps its project within quota and takes the room back first
    quotas = {p: 0 if young else draw(st.integers(0, u)) for p, u in sorted(usage.items())}
    excess = sum(quotas.values()) + gpus - size * count
    for p in sorted(quotas):
        cut = min(quotas[p], max(0, excess))
        quotas[p] -= cut
        excess -= cut
    projects = tuple(Project(p, q * GPU) for p, q in quotas.items()) + (Project("z", gpus * GPU),)
    claimant = TrainJob("z1", "z", gpus * GPU, submit_time=now)
    nodes = tuple(Node(f"n{i}", size) for i in range(count))
    return Snapshot(now, nodes, projects, tuple(jobs) + (claimant,))


# -- brute-force arithmetic of the checks -------------------------------------------------------

def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def biggest_node(snap: Snapshot) -> int:
    return max(n.milli for n in snap.train_nodes())


def free_per_node(snap: Snapshot) -> dict[str, int]:
    """Milli-GPUs no running job holds (jobs being preempted still hold theirs)."""
    free = {n.name: n.milli for n in snap.train_nodes()}
    for j in snap.jobs:
        if j.running:
            for name, amount in j.placement.items():
                free[name] -= amount
    return free


def usage_of(snap: Snapshot) -> dict[str, int]:
    """Running milli-GPUs per project, jobs being preempted not counted."""
    usage = {p.name: 0 for p in snap.projects}
    for j in snap.jobs:
        if j.running and not j.preempting:
            usage[j.project] = usage.get(j.project, 0) + j.gpus
    return usage


def fits(free: dict[str, int], gpus: int, biggest: int, exclude=frozenset()) -> bool:
    """Can a gang of ``gpus`` go on the fewest nodes (one when it fits on one)?"""
    names = [n for n in free if n not in exclude]
    k = ceil_div(gpus, biggest)
    return any(sum(free[n] for n in chosen) >= gpus for chosen in combinations(names, k))


def order_key(snap: Snapshot):
    """Queue order across projects: the project's priority, then the time the job queues from
    (its submit, or its requeue: ``waiting_since``). A job's own priority orders it within its
    project only (``queue_key``), never against another project's jobs."""
    prio = {p.name: p.priority for p in snap.projects}
    return lambda j: (-prio.get(j.project, 0), j.waiting_since, j.id)


def ahead(snap: Snapshot, a: TrainJob, b: TrainJob) -> bool:
    """Whether the policy serves ``a`` before ``b``."""
    if a.project == b.project:
        return queue_key(a) < queue_key(b)
    key = order_key(snap)
    return key(a) < key(b)


def first_guaranteed(snap: Snapshot) -> TrainJob | None:
    """The job the policy must serve first: of each project's queue, the first job that keeps
    its project within quota (and could ever run at all); of those, the earliest across
    projects."""
    usage, projects = usage_of(snap), {p.name: p for p in snap.projects}
    capacity = snap.train_capacity()
    departments = {d.name: d for d in snap.departments}
    heads = []
    for name, p in projects.items():
        d = departments.get(p.department)
        for j in sorted((j for j in snap.jobs if j.pending and j.project == name),
                        key=queue_key):
            if j.gpus > capacity or (p.limit is not None and j.gpus > p.limit) or \
                    (d is not None and d.limit is not None and j.gpus > d.limit):
                continue
            if usage[name] + j.gpus <= p.quota:
                heads.append(j)
                break
    return min(heads, key=order_key(snap), default=None)


def best_subset_sum(amounts: list[int], cap: int) -> int:
    """The largest sum of some of ``amounts`` that is at most ``cap``."""
    reachable = {0}
    for a in amounts:
        reachable |= {r + a for r in reachable if r + a <= cap}
    return max(reachable)


def room_for(claimant: TrainJob, snap: Snapshot, config: PolicyConfig) -> bool:
    """Do over-quota projects hold enough GPUs to make room for ``claimant``?

    Conservatively: some set of the fewest nodes the gang needs holds it with what is free,
    what is being released, and the GPUs of old-enough jobs lying wholly on those nodes
    whose projects stay at or above their quotas without them.
    """
    usage, quota = usage_of(snap), {p.name: p.quota for p in snap.projects}
    free = free_per_node(snap)
    releasing = dict.fromkeys(free, 0)
    for j in snap.jobs:
        if j.running and j.preempting:
            for name, amount in j.placement.items():
                releasing[name] += amount
    spare = {p: usage[p] - quota.get(p, 0) for p in usage
             if p != claimant.project and usage[p] > quota.get(p, 0)}
    victims = [j for j in snap.jobs if j.running and not j.preempting and j.project in spare
               and snap.now - (j.start_time or 0.0) >= config.min_runtime_s]
    home = next((d for d in snap.departments if d.name == projects_of(snap)[claimant.project]
                 .department), None)
    if home is not None and home.limit is not None:  # its siblings must make room under the limit
        members = {p.name for p in snap.projects if p.department == home.name}
        excess = sum(usage.get(m, 0) for m in members) + claimant.gpus - home.limit
        if excess > 0 and sum(min(spare.get(m, 0), sum(v.gpus for v in victims
                                                         if v.project == m))
                              for m in members) < excess:
            return False
    k = ceil_div(claimant.gpus, biggest_node(snap))
    for chosen in combinations(free, k):
        inside = set(chosen)
        have = sum(free[n] + releasing[n] for n in chosen)
        for p, cap in spare.items():
            mine = [v.gpus for v in victims if v.project == p and set(v.placement) <= inside]
            have += best_subset_sum(mine, cap)
        if have >= claimant.gpus:
            return True
    return False


def projects_of(snap: Snapshot) -> dict[str, Project]:
    return {p.name: p for p in snap.projects}


def current_reservation(snap: Snapshot, config: PolicyConfig) -> tuple[str | None, frozenset]:
    """The reservation in force while this snapshot is scheduled."""
    names = {n.name for n in snap.train_nodes()}
    if config.reservations:
        for j in snap.jobs:
            if j.pending and j.reserved and set(j.reserved) <= names:
                return j.id, frozenset(j.reserved)
    return None, frozenset()


# -- the contract, one cycle at a time -----------------------------------------------------------

EXCUSED = (R.AtLimit, R.TooLarge, R.Reclaiming, R.Releasing, R.BehindClaim, R.Moving)
CLAIMS = (R.Reclaiming, R.Releasing, R.Moving)


class Contract:
    """Checks every cycle of one run; counts what it checked so emptiness shows."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.stats = {"cycles": 0, "starts": 0, "preemptions": 0, "guarantees": 0,
                      "guarantees_by_reclaim": 0, "guarantees_excused": 0}

    def check(self, snap: Snapshot) -> tuple[CycleResult, Snapshot]:
        result, again = cycle(snap, self.config), cycle(snap, self.config)
        assert again == result and again.waits == result.waits, \
            "same snapshot, different decisions"  # 8
        self.every_pending_job_is_answered(snap, result)
        free = self.never_over_allocate(snap, result)  # 1
        self.gangs_are_atomic(snap, result)  # 2
        self.victims_are_over_quota(snap, result)  # 3, 6
        self.departments_keep_their_limits(snap, result)
        self.within_quota_jobs_get_room(snap, result)  # 3
        self.work_conserving(snap, result, free)  # 4
        self.stats["cycles"] += 1
        self.stats["starts"] += len(result.starts)
        self.stats["preemptions"] += len(result.preemptions)
        return result, apply(snap, result)

    def every_pending_job_is_answered(self, snap: Snapshot, result: CycleResult) -> None:
        """A pending job starts or is told why it waits, once; only a waiting job reserves."""
        pending = {j.id for j in snap.jobs if j.pending}
        started = {s.job for s in result.starts}
        waiting = [w.job for w in result.waits]
        assert len(set(waiting)) == len(waiting), "a job is told twice why it waits"
        assert set(waiting) == pending - started, "a pending job neither starts nor waits"
        if result.reservation is not None:  # and the nodes it keeps will hold the holder
            holder = next(j for j in snap.jobs if j.id == result.reservation.job)
            assert holder.id in pending - started
            sizes = {n.name: n.milli for n in snap.train_nodes()}
            kept = {n: sizes[n] for n in result.reservation.reserved}
            assert fits(kept, holder.gpus, biggest_node(snap)), \
                f"{holder.id} ({holder.gpus}) reserves {kept}, where it can never run"

    def never_over_allocate(self, snap: Snapshot, result: CycleResult) -> dict[str, int]:
        """What is left free once the starts run, while preempted jobs still hold theirs."""
        free = free_per_node(snap)
        for s in result.starts:
            for name, amount in s.placement.items():
                free[name] -= amount
        for name, left in free.items():
            assert left >= 0, f"node {name} over-allocated by {-left} milli-GPUs"
        return free

    def gangs_are_atomic(self, snap: Snapshot, result: CycleResult) -> None:
        jobs = {j.id: j for j in snap.jobs}
        nodes = {n.name: n.milli for n in snap.train_nodes()}
        started = [s.job for s in result.starts]
        assert len(set(started)) == len(started), "a job started twice in one cycle"
        for s in result.starts:
            job = jobs[s.job]
            assert job.pending, f"{s.job} started but was not pending"
            assert set(s.placement) <= set(nodes), f"{s.job} placed off the train pool"
            assert all(0 < m <= nodes[n] for n, m in s.placement.items())
            assert sum(s.placement.values()) == job.gpus, f"{s.job} started partially"
            assert len(s.placement) == ceil_div(job.gpus, biggest_node(snap)), \
                f"{s.job} ({job.gpus}) spread over {len(s.placement)} nodes"
        victims = [p.job for p in result.preemptions]
        assert len(set(victims)) == len(victims), "a job preempted twice in one cycle"
        assert not set(victims) & set(started), "a job started and preempted in one cycle"

    def victims_are_over_quota(self, snap: Snapshot, result: CycleResult) -> None:
        jobs = {j.id: j for j in snap.jobs}
        quota = {p.name: p.quota for p in snap.projects}
        usage = usage_of(snap)
        for p in result.preemptions:
            victim, claimant = jobs[p.job], jobs[p.for_job]
            assert victim.running and not victim.preempting, f"{p.job} was not running"
            assert claimant.pending, f"{p.job} preempted for {p.for_job}, which is not pending"
            assert snap.now - victim.start_time >= self.config.min_runtime_s, \
                f"{p.job} preempted before its minimum runtime"
            if p.kind == "move":  # contract 6's one exception, with consolidate
                assert self.config.consolidate, f"{p.job} moved without consolidate"
                assert len(victim.placement) == 1, f"{p.job} moved off several nodes"
                assert usage[victim.project] <= quota.get(victim.project, 0), \
                    f"{p.job} moved while project {victim.project} ran beyond its quota"
                assert usage[claimant.project] + claimant.gpus <= quota.get(claimant.project, 0), \
                    f"{p.job} moved for {p.for_job}, which would take its project beyond quota"
                self.stats["moves"] = self.stats.get("moves", 0) + 1
                continue  # its project keeps its GPUs: they are kept for it elsewhere
            if self.config.preempt_within_project and victim.project == claimant.project:
                assert victim.priority < claimant.priority, \
                    f"{p.job} preempted for {p.for_job} of its own project without lower priority"
            else:
                assert victim.project != claimant.project
                assert usage[victim.project] > quota.get(victim.project, 0), (
                    f"{p.job} preempted for {p.for_job} while project {victim.project} ran "
                    f"{usage[victim.project]}, within its quota {quota.get(victim.project, 0)}")
            usage[victim.project] -= victim.gpus

    def departments_keep_their_limits(self, snap: Snapshot, result: CycleResult) -> None:
        """No job starts that leaves its department beyond its limit, once this cycle's
        victims are gone."""
        limited = {d.name: d.limit for d in snap.departments if d.limit is not None}
        if not limited:
            return
        jobs, projects = {j.id: j for j in snap.jobs}, projects_of(snap)
        held = dict.fromkeys(limited, 0)
        for name, amount in usage_of(snap).items():
            home = projects[name].department if name in projects else ""
            if home in held:
                held[home] += amount
        for p in result.preemptions:
            home = projects[jobs[p.job].project].department
            if home in held:
                held[home] -= jobs[p.job].gpus
        starting = dict.fromkeys(limited, 0)
        for s in result.starts:
            home = projects[jobs[s.job].project].department
            if home in held:
                held[home] += jobs[s.job].gpus
                starting[home] += 1
        for name, limit in limited.items():
            assert not starting[name] or held[name] <= limit, (
                f"department {name} runs {held[name]} once this cycle's jobs start, beyond "
                f"its limit of {limit}")

    def within_quota_jobs_get_room(self, snap: Snapshot, result: CycleResult) -> None:
        """The guarantee, for the first job that keeps its project within quota.

        Nothing ahead of it can take the room in this cycle (guaranteed jobs are served in
        queue order before any borrower), so when over-quota projects hold enough GPUs it
        starts, or claims them now and starts within the grace cycle and one more, unless a
        job ahead of it in the queue keeps its own project within quota by then.
        """
        if not self.config.preemption:
            return
        claimant = first_guaranteed(snap)
        if claimant is None or not room_for(claimant, snap, self.config):
            return
        self.stats["guarantees"] += 1
        if any(s.job == claimant.id for s in result.starts):
            return
        wait = next(w for w in result.waits if w.job == claimant.id)
        assert isinstance(wait.reason, CLAIMS), (
            f"{claimant.id} keeps {claimant.project} within quota and over-quota jobs hold "
            f"room for it, but it waits: {wait.reason}")
        self.stats["guarantees_by_reclaim"] += 1
        fork = replace(apply(snap, result), now=snap.now + DT)  # no arrivals, nothing ends
        for grace in (1, 2):
            later = cycle(fork, self.config)
            if any(s.job == claimant.id for s in later.starts):
                return  # (a job served before it, with room for both, is no excuse needed)
            first = first_guaranteed(fork)
            if first is None or first.id != claimant.id:
                self.stats["guarantees_excused"] += 1
                if first is not None and ahead(fork, first, claimant):
                    event("guarantee excused: a job ahead of the claimant took the room")
                    return
                mine = [j for j in fork.jobs if j.pending and j.project == claimant.project
                        and ahead(fork, j, claimant)]
                if any(usage_of(fork)[claimant.project] + j.gpus <=
                       projects_of(fork)[claimant.project].quota for j in mine):
                    # e.g. a requeued victim of higher job priority, ahead in its own queue
                    event("guarantee excused: a job ahead in its own project took the room")
                    return
                # Contract 4 lets a later job of the claimant's own project borrow idle GPUs
                # the gang cannot use; that uses up the quota room it counted on (contract 3).
                grew = usage_of(fork)[claimant.project] > usage_of(snap)[claimant.project]
                assert grew, (f"{claimant.id} claimed room at {snap.now} but no longer keeps "
                              f"{claimant.project} within quota at {fork.now}")
                event("guarantee excused: the claimant's own project used its quota room")
                return
            reason = next(w.reason for w in later.waits if w.job == claimant.id)
            assert grace == 1 and isinstance(reason, CLAIMS), (
                f"{claimant.id} claimed room at {snap.now} but has not started "
                f"{grace} cycle(s) later: {reason}")
            fork = replace(apply(fork, later), now=fork.now + DT)

    def work_conserving(self, snap: Snapshot, result: CycleResult, free: dict) -> None:
        free = dict(free)
        for name, amount in result.held.items():
            free[name] -= amount
            assert free[name] >= 0, f"held more than is free on {name}"
        holder, reserved = current_reservation(snap, self.config)
        projects = {p.name: p for p in snap.projects}
        committed = usage_of(snap)
        for s in result.starts:
            j = next(j for j in snap.jobs if j.id == s.job)
            committed[j.project] += j.gpus
        waiting = {j.id: j for j in snap.jobs if j.pending}
        for w in result.waits:
            if isinstance(w.reason, CLAIMS):
                committed[waiting[w.job].project] += waiting[w.job].gpus
        biggest = biggest_node(snap)
        for w in result.waits:
            if isinstance(w.reason, EXCUSED):
                continue
            job = waiting[w.job]
            exclude = reserved if job.id != holder else frozenset()
            assert not fits(free, job.gpus, biggest, exclude), (
                f"{job.id} ({job.gpus}) waits ({w.reason}) while {free} is free "
                f"(reserved for {holder}: {sorted(reserved)})")
            p = projects.get(job.project)
            if p is not None and committed[p.name] + job.gpus <= p.quota:
                assert not fits(free, job.gpus, biggest), \
                    f"{job.id} keeps its project within quota but waits behind a reservation"


# -- driving a world through cycles --------------------------------------------------------------

def run(world: World, cycles: int, contract: Contract | None = None):
    """Yield (result, snapshot before the cycle) for ``cycles`` cycles of ``world``."""
    duration = {a.job.id: a.duration for a in world.arrivals}
    snap = Snapshot(0.0, world.nodes, world.projects, (), departments=world.departments)
    ended: set[str] = set()
    for t in range(cycles):
        snap = replace(snap, now=t * DT)
        # Run time over, even during a grace period: exit 0, which ends the job.
        done = [j.id for j in snap.jobs if j.running and duration[j.id] is not None
                and snap.now - j.start_time >= duration[j.id] * DT]
        for j in snap.jobs:
            if j.id in done and j.preempting:
                assert after_stop(0) == SUCCEEDED
                event("a preempted job finished within its grace")
        snap = finish(snap, *done)
        ended.update(done)
        snap = replace(snap, jobs=snap.jobs + tuple(a.job for a in world.arrivals if a.step == t))
        assert not ended & {j.id for j in snap.jobs}, "a job that finished runs again"
        before = snap
        if contract is not None:
            result, snap = contract.check(snap)
        else:
            result = cycle(snap, world.config)
            snap = apply(snap, result)
        yield result, before


def describe(world: World) -> None:
    note(f"nodes: {[n.gpus for n in world.nodes]}")
    note(f"projects: {world.projects}")
    note(f"departments: {world.departments}")
    note(f"config: {world.config}")
    for a in world.arrivals:
        note(f"  step {a.step}: {a.job.id} {a.job.project} {a.job.gpus // GPU} GPUs "
             f"prio {a.job.priority} for {a.duration}")


@SETTINGS
@given(worlds())
def test_every_cycle_keeps_the_contract(world):
    describe(world)
    contract = Contract(world.config)
    for _ in run(world, 30, contract):
        pass
    event(f"preemptions: {'some' if contract.stats['preemptions'] else 'none'}")
    event(f"departments: {len(world.departments)}, "
          f"limited: {sum(d.limit is not None for d in world.departments)}")
    event(f"guarantee by reclaim checked: {bool(contract.stats['guarantees_by_reclaim'])}")


@SETTINGS
@given(snapshots(), configs(moves=True))
def test_any_snapshot_gets_decisions_that_keep_the_contract(snap, config):
    note(f"snapshot: {snap}")
    result, _ = Contract(config).check(snap)
    reordered = cycle(replace(snap, jobs=snap.jobs[::-1]), config)  # the same state
    assert reordered == result and reordered.waits == result.waits


@SETTINGS
@given(full_pools(), configs(moves=True))
def test_a_within_quota_job_gets_room_in_a_full_pool(snap, config):
    note(f"snapshot: {snap}")
    contract = Contract(config)
    contract.check(snap)
    event(f"room on few enough nodes: {bool(contract.stats['guarantees'])}")
    event(f"moves: {bool(contract.stats.get('moves'))}")


@SETTINGS
@given(worlds(max_jobs=16, arrive_until=3, finite=False))
def test_no_flapping_once_arrivals_stop(world):
    """With no arrivals and no job ending, the system settles, then nothing changes."""
    describe(world)
    history = []
    for result, before in run(world, 50):
        history.append((before.now, [s.job for s in result.starts],
                        [p.job for p in result.preemptions]))
    restless = [h for h in history[-10:] if h[1] or h[2]]
    assert not restless, f"still changing after {history[-10][0]} s: {history}"


@st.composite
def idle_and_busy(draw, now=100.0):
    """One node full of 1-GPU jobs, some idle, of projects within and over their quotas, and a
    claimant ``z`` within its quota that needs some of them back."""
    size = draw(st.integers(2, 8))
    owners = draw(st.lists(st.sampled_from(["x", "y", "w"]), min_size=size, max_size=size))
    jobs = tuple(TrainJob(f"r{i}", p, GPU, submit_time=now - 10 * (i + 1),
                          state=JobState.RUNNING, placement={"n0": GPU},
                          start_time=now - 10 * (i + 1), idle=draw(st.booleans()))
                 for i, p in enumerate(owners))
    w_quota = owners.count("w")  # w runs within its quota: never a victim
    over = size - w_quota
    need = draw(st.integers(0, over))
    projects = (Project("x", 0), Project("y", 0), Project("w", w_quota * GPU),
                Project("z", need * GPU))
    claim = (TrainJob("z1", "z", need * GPU, submit_time=now),) if need else ()
    return Snapshot(now, (Node("n0", size),), projects, jobs + claim), need


@SETTINGS
@given(idle_and_busy(), configs())
def test_idle_jobs_are_reclaimed_before_busy_ones(drawn, config):
    """``reclaim_idle_first``: a reclaim takes over-quota projects' idle jobs before their
    busy ones, and still only over-quota projects' jobs (the guarantee is unchanged)."""
    snap, need = drawn
    note(f"snapshot: {snap}")
    config = replace(config, min_runtime_s=0.0)
    result, _ = Contract(config).check(snap)
    victims = [j for j in snap.jobs if j.id in {p.job for p in result.preemptions}]
    assert all(v.project in ("x", "y") for v in victims)
    assert len(victims) == need
    idle = [j for j in snap.jobs if j.project in ("x", "y") and j.idle]
    assert sum(v.idle for v in victims) == min(len(idle), need)
    event(f"idle and busy over quota: {0 < len(idle) < need}")


def test_the_guarantee_check_is_exercised():
    """The contested world below makes the guarantee check reclaim, so it is not vacuous."""
    nodes = tuple(Node(f"n{i}", g) for i, g in enumerate((8, 8, 4)))
    projects = (Project("susan", 2 * GPU), Project("joe", 6 * GPU, 2), Project("jemma", 4 * GPU))
    arrivals = []
    for i in range(12):  # susan fills the pool early with long jobs
        arrivals.append(Arrival(0, TrainJob(f"s{i}", "susan", (1 + i % 3) * GPU,
                                            submit_time=0.0), None))
    for i, (who, gpus, step) in enumerate([("joe", 2, 3), ("jemma", 4, 4), ("joe", 4, 6),
                                           ("jemma", 1, 8), ("joe", 8, 12)]):
        arrivals.append(Arrival(step, TrainJob(f"c{i}", who, gpus * GPU, submit_time=step * DT),
                                6))
    world = World(nodes, projects, tuple(arrivals), PolicyConfig())
    contract = Contract(world.config)
    for _ in run(world, 40, contract):
        pass
    assert contract.stats["guarantees_by_reclaim"] >= 3, contract.stats
    assert contract.stats["preemptions"] >= 3, contract.stats


@SETTINGS
@given(full_pools(young=True), st.sampled_from([15.0, 40.0, 60.0, 100.0]))
def test_the_guarantee_bound_is_min_runtime_plus_a_cycle_plus_the_grace(snap, min_runtime):
    """Every job that could give GPUs back has just started: the claimant waits out the
    minimum runtime, the first cycle after it claims the GPUs (at most one cycle later), and
    it starts once the victims are gone: min_runtime + cycle + grace after it arrived. Here
    the grace is a cycle and a release is seen at the next cycle (the contract check above:
    "the grace cycle and one more"), so the grace counts two cycles; the service sees an
    exit within 0.1 s."""
    config = PolicyConfig(min_runtime_s=min_runtime)
    claimant = next(j for j in snap.jobs if j.pending)
    if not room_for(claimant, snap, PolicyConfig()):  # no room on few enough nodes at all
        event("no room for the claimant")
        return
    bound = min_runtime + DT + 2 * DT
    arrived, now = snap.now, snap.now
    while now <= arrived + bound:
        result = cycle(snap, config)
        if any(s.job == claimant.id for s in result.starts):
            event("claimant started within the bound")
            return
        if now < arrived + min_runtime:
            assert not result.preemptions, "a job was preempted before its minimum runtime"
        snap = replace(apply(snap, result), now=now + DT)
        now = snap.now
    raise AssertionError(f"{claimant.id} had not started {bound:g} s after it arrived "
                         f"(min_runtime {min_runtime:g} s, cycle and grace {DT:g} s)")
