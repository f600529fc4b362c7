"""Fluent builders for policy tests, and a scheduler-service stand-in that applies decisions.

Amounts in the builders are whole GPUs; the frozen model objects they make hold milli-GPUs.

    snap = (cluster(nodes=1, gpus_per_node=8)
            .projects(project("susan").quota(2), project("joe").quota(2))
            .jobs(job("s1").project("susan").gpus(4).running_on(n0=4, since=0),
                  pending("j1", "joe", gpus=2, submitted=100))
            .at(100))
    result, snap = step(snap)      # decide, apply as the service would, move the clock on
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from jupyter_gpushare.policy import (BUILD, GPU, TRAIN, CycleResult, Department, JobState, Node,
                                     PolicyConfig, Project, Snapshot, TrainJob, cycle)

__all__ = [
    "GPU", "JobBuilder", "ProjectBuilder", "ClusterBuilder", "job", "pending", "running",
    "project", "cluster", "apply", "step", "finish", "submit", "reason_of", "wait_of", "job_of",
    "started", "preempted", "milli",
]


def milli(gpus: int | float) -> int:
    """Whole (or fractional) GPUs → milli-GPUs."""
    return round(gpus * GPU)


def _built(thing):
    return thing.build() if hasattr(thing, "build") else thing


# -- jobs ------------------------------------------------------------------------------

class JobBuilder:
    """``job("s1").project("susan").gpus(4).running_on(n0=4, since=0)``; pending by default."""

    def __init__(self, id: str):
        self._kw: dict = {"id": id, "project": "default"}
        self._gpus: int | None = None

    def project(self, name: str) -> "JobBuilder":
        self._kw["project"] = name
        return self

    def gpus(self, n: int) -> "JobBuilder":
        self._gpus = n
        return self

    def user(self, name: str) -> "JobBuilder":
        self._kw["user"] = name
        return self

    def priority(self, p: int) -> "JobBuilder":
        self._kw["priority"] = p
        return self

    def submitted(self, at: float) -> "JobBuilder":
        self._kw["submit_time"] = at
        return self

    def attempt(self, n: int) -> "JobBuilder":
        self._kw["attempt"] = n
        return self

    def running_on(self, since: float = 0.0, **gpus_per_node: int) -> "JobBuilder":
        """Running since ``since`` with ``node=gpus`` placement; sets gpus when not given."""
        self._kw.update(state=JobState.RUNNING, start_time=since,
                        placement={n: milli(g) for n, g in gpus_per_node.items()})
        if self._gpus is None:
            self._gpus = sum(gpus_per_node.values())
        return self

    def preempting(self) -> "JobBuilder":
        self._kw["preempting"] = True
        return self

    def reserved(self, *nodes: str) -> "JobBuilder":
        self._kw["reserved"] = tuple(nodes)
        return self

    def build(self) -> TrainJob:
        return TrainJob(gpus=milli(self._gpus if self._gpus is not None else 1), **self._kw)


def job(id: str) -> JobBuilder:
    return JobBuilder(id)


def pending(id: str, project: str, gpus: int = 1, *, submitted: float | None = None,
            priority: int = 0) -> JobBuilder:
    """A pending job in one line: ``pending("j1", "joe", gpus=2, submitted=100)``; without
    ``submitted`` it was submitted at 0, or at ``submit``'s now."""
    built = job(id).project(project).gpus(gpus).priority(priority)
    return built if submitted is None else built.submitted(submitted)


def running(id: str, project: str, gpus: int, since: float, node: str = "n0") -> JobBuilder:
    """A job submitted and started at ``since`` on one node: ``running("s1", "susan", 4, 0)``."""
    return job(id).project(project).gpus(gpus).submitted(since).running_on(since=since,
                                                                          **{node: gpus})


# -- projects --------------------------------------------------------------------------

class ProjectBuilder:
    """``project("joe").quota(2).weight(3).limit(4).priority(1).department("research")``."""

    def __init__(self, name: str):
        self._kw: dict = {"name": name}

    def quota(self, gpus: int) -> "ProjectBuilder":
        self._kw["quota"] = milli(gpus)
        return self

    def weight(self, w: int) -> "ProjectBuilder":
        self._kw["over_quota_weight"] = w
        return self

    def limit(self, gpus: int | None) -> "ProjectBuilder":
        self._kw["limit"] = None if gpus is None else milli(gpus)
        return self

    def priority(self, p: int) -> "ProjectBuilder":
        self._kw["priority"] = p
        return self

    def department(self, name: str) -> "ProjectBuilder":
        self._kw["department"] = name
        return self

    def build(self) -> Project:
        return Project(**self._kw)


def project(name: str) -> ProjectBuilder:
    return ProjectBuilder(name)


# -- the cluster and a whole snapshot ---------------------------------------------------

class ClusterBuilder:
    """Train nodes ``n0, n1, ...`` (and optional build nodes ``b0, ...``), projects and jobs."""

    def __init__(self, sizes: Iterable[int], build_sizes: Iterable[int] = ()):
        self._nodes = [Node(f"n{i}", g, TRAIN) for i, g in enumerate(sizes)]
        self._nodes += [Node(f"b{i}", g, BUILD) for i, g in enumerate(build_sizes)]
        self._projects: list[Project] = []
        self._jobs: list[TrainJob] = []
        self._departments: list[Department] = []

    def departments(self, *departments: Department) -> "ClusterBuilder":
        self._departments += departments
        return self

    def projects(self, *projects) -> "ClusterBuilder":
        self._projects += [_built(p) for p in projects]
        return self

    def jobs(self, *jobs) -> "ClusterBuilder":
        self._jobs += [_built(j) for j in jobs]
        return self

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def at(self, now: float = 0.0) -> Snapshot:
        return Snapshot(now, tuple(self._nodes), tuple(self._projects), tuple(self._jobs),
                        departments=tuple(self._departments))


def cluster(nodes: int = 1, gpus_per_node: int = 8, *, sizes: Iterable[int] | None = None,
            build_nodes: Iterable[int] = ()) -> ClusterBuilder:
    """``cluster(nodes=2, gpus_per_node=8)`` or ``cluster(sizes=(8, 4, 2))``."""
    return ClusterBuilder(sizes if sizes is not None else [gpus_per_node] * nodes, build_nodes)


# -- the scheduler service, as far as tests need one -------------------------------------

def apply(snap: Snapshot, result: CycleResult) -> Snapshot:
    """Carry out ``result`` on ``snap`` as the scheduler service does; the clock stays.

    Jobs that were already being preempted have had their grace step: they are requeued
    (pending, attempt + 1, same submit time, queued again from now: ``requeued``). Starts run from ``snap.now``; new preemptions
    keep their GPUs until the next apply. The reservation goes to the job the cycle named.
    """
    starts = {s.job: dict(s.placement) for s in result.starts}
    preempted = {p.job for p in result.preemptions}
    holder = result.reservation
    reserved = {holder.job: tuple(holder.reserved)} if holder is not None else {}
    jobs = []
    for j in snap.jobs:
        if j.running and j.preempting:
            j = replace(j, state=JobState.PENDING, attempt=j.attempt + 1, placement={},
                        start_time=None, preempting=False, requeued=snap.now)
        elif j.id in starts:
            assert j.pending, f"{j.id} started but was not pending"
            j = replace(j, state=JobState.RUNNING, placement=starts[j.id], start_time=snap.now)
        elif j.id in preempted:
            assert j.running and not j.preempting, f"{j.id} preempted but was not running"
            j = replace(j, preempting=True)
        j = replace(j, reserved=reserved.get(j.id, ()) if j.pending else ())
        jobs.append(j)
    return replace(snap, jobs=tuple(jobs))


def step(snap: Snapshot, config: PolicyConfig = PolicyConfig(),
         dt: float = 10.0) -> tuple[CycleResult, Snapshot]:
    """One cycle: decide on ``snap``, apply it, and move the clock on by ``dt``."""
    result = cycle(snap, config)
    after = apply(snap, result)
    return result, replace(after, now=snap.now + dt)


def finish(snap: Snapshot, *ids: str) -> Snapshot:
    """The named jobs end (succeed or are cancelled): they leave the snapshot."""
    gone = set(ids)
    return replace(snap, jobs=tuple(j for j in snap.jobs if j.id not in gone))


def submit(snap: Snapshot, *jobs) -> Snapshot:
    """New pending jobs arrive; their submit time defaults to now."""
    new = []
    for j in jobs:
        built = _built(j)
        if isinstance(j, JobBuilder) and "submit_time" not in j._kw:
            built = replace(built, submit_time=snap.now)
        new.append(built)
    return replace(snap, jobs=snap.jobs + tuple(new))


# -- reading results ---------------------------------------------------------------------

def job_of(snap: Snapshot, id: str) -> TrainJob:
    return next(j for j in snap.jobs if j.id == id)


def wait_of(result: CycleResult, id: str):
    return next(w for w in result.waits if w.job == id)


def reason_of(result: CycleResult, id: str):
    return wait_of(result, id).reason


def started(result: CycleResult) -> dict[str, dict[str, int]]:
    """Job id → placement in whole GPUs."""
    return {s.job: {n: m // GPU for n, m in s.placement.items()} for s in result.starts}


def preempted(result: CycleResult) -> list[str]:
    return [p.job for p in result.preemptions]


def burst_trace(folder, jobs: int, projects: int):
    """``benchmarks/reclaim_burst.py``'s burst at another size, as the simulator's jobs (the
    trace written in ``folder``)."""
    import importlib.util
    from pathlib import Path

    from jupyter_gpushare.sim.trace import read_trace

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reclaim_burst.py"
    spec = importlib.util.spec_from_file_location("reclaim_burst", path)
    burst = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(burst)
    burst.write_burst(Path(folder) / "burst.csv", jobs, projects)
    return read_trace(Path(folder) / "burst.csv")
