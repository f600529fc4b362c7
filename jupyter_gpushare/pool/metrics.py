"""Prometheus metrics of the pool (text exposition format), computed when scraped.

Every metric is declared once, in ``METRICS``: the collectors fill them and the documentation's
metrics reference is made from the same table."""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..policy.model import GPU


@dataclass(frozen=True)
class Metric:
    """One metric family: its name, kind (``gauge`` or ``counter``), help text and labels."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exposed(self) -> str:
        """The name a scrape shows: counters get ``_total``, as the exposition format says."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def family(self):
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        return cls(self.name, self.help, labels=list(self.labels))


_GPU = ("node", "gpu", "pool")
TRAIN_GPUS = Metric("gpushare_train_gpus", "gauge", "GPUs in the train pool")
_PROJECT = ("project", "department")  # department: "" for a project in none
PROJECT_IN_USE = Metric("gpushare_project_gpus_in_use", "gauge", "GPUs a project's jobs hold",
                        _PROJECT)
PROJECT_QUOTA = Metric("gpushare_project_quota_gpus", "gauge", "A project's guaranteed GPUs",
                       _PROJECT)
PROJECT_DESERVED = Metric("gpushare_project_deserved_gpus", "gauge",
                          "A project's deserved share in the last cycle", _PROJECT)
DEPARTMENT_IN_USE = Metric("gpushare_department_gpus_in_use", "gauge", "GPUs a department's "
                           "projects hold together", ("department",))
DEPARTMENT_QUOTA = Metric("gpushare_department_quota_gpus", "gauge", "A department's "
                          "guaranteed GPUs, for its projects together", ("department",))
DEPARTMENT_LIMIT = Metric("gpushare_department_limit_gpus", "gauge", "The most GPUs a "
                          "department's projects may hold together (absent: no limit)",
                          ("department",))
PROJECT_RECENT_BORROWED = Metric(
    "gpushare_project_recent_borrowed_gpu_seconds", "gauge", "Fair share over time: a project's "
    "GPU-seconds beyond its quota, decayed by fair_share_half_life over fair_share_window "
    "(present only while fair share over time is on)", ("project",))
JOBS = Metric("gpushare_jobs", "gauge", "Jobs by state and project", ("state", "project"))
GPU_UTILIZATION = Metric("gpushare_gpu_utilization_ratio", "gauge", "SM utilization of a GPU "
                         "at its last reading (0-1); absent where NVML cannot say (MIG, a lost "
                         "GPU)", _GPU)
GPU_MEMORY_USED = Metric("gpushare_gpu_memory_used_bytes", "gauge", "GPU memory in use", _GPU)
GPU_MEMORY_TOTAL = Metric("gpushare_gpu_memory_total_bytes", "gauge", "GPU memory", _GPU)
GPU_ALLOCATED = Metric("gpushare_gpu_allocated_ratio", "gauge", "Share of a GPU held by jobs "
                       "and slices (0-1)", _GPU)
GPU_LOST = Metric("gpushare_gpu_lost", "gauge", "1 when NVML reports the GPU fallen off the bus",
                  _GPU)
GPU_OUTSIDE = Metric("gpushare_gpu_outside_processes", "gauge", "Processes on a GPU that no job "
                     "or slice of gpushare owns", _GPU)
PROJECT_SECONDS = Metric("gpushare_project_gpu_seconds", "counter", "GPU-seconds of a project's "
                         "jobs since the service started: allocated (held), utilized (SM "
                         "utilization x GPUs x time), idle (held below the idle threshold)",
                         ("project", "kind"))
USER_SECONDS = Metric("gpushare_user_gpu_seconds", "counter", "GPU-seconds of a user's jobs and "
                      "build slices since the service started, as for projects", ("user", "kind"))
POOL_SECONDS = Metric("gpushare_pool_gpu_seconds", "counter", "GPU-seconds of a pool since the "
                      "service started: capacity (GPUs present x time), allocated, utilized, "
                      "idle", ("pool", "kind"))
JOBS_IDLE = Metric("gpushare_jobs_idle", "gauge", "Running jobs whose GPUs have stayed below the "
                   "idle threshold for idle_job_after", ("project",))
SLICES_CULLED = Metric("gpushare_slices_culled", "counter", "Notebook servers stopped because "
                       "their build slice and kernels sat idle (only while culling is on)")
USAGE_PROBLEMS = Metric("gpushare_usage_problems", "gauge", "Sentences api/pool has about what "
                        "could not be read (MIG, lost GPUs, no NVML, stray processes)")

METRICS = (TRAIN_GPUS, PROJECT_IN_USE, PROJECT_QUOTA, PROJECT_DESERVED, PROJECT_RECENT_BORROWED,
           DEPARTMENT_IN_USE, DEPARTMENT_QUOTA, DEPARTMENT_LIMIT, JOBS, GPU_UTILIZATION,
           GPU_MEMORY_USED, GPU_MEMORY_TOTAL, GPU_ALLOCATED, GPU_LOST, GPU_OUTSIDE,
           PROJECT_SECONDS, USER_SECONDS, POOL_SECONDS, JOBS_IDLE, SLICES_CULLED, USAGE_PROBLEMS)


class _PoolCollector:
    """The train pool, its projects and their jobs."""

    def __init__(self, store, scheduler):
        self.store, self.scheduler = store, scheduler

    def collect(self):
        ex = self.scheduler.explained
        capacity = TRAIN_GPUS.family()
        capacity.add_metric([], sum(n.gpus for n in ex.nodes))
        yield capacity
        in_use = PROJECT_IN_USE.family()
        quota = PROJECT_QUOTA.family()
        deserved = PROJECT_DESERVED.family()
        held: dict[str, int] = {}
        for p in self.store.quotas.projects():
            labels = [p.name, p.department or ""]
            in_use.add_metric(labels, ex.usage.get(p.name, 0) / GPU)
            quota.add_metric(labels, p.quota / GPU)
            deserved.add_metric(labels, ex.deserved.get(p.name, 0) / GPU)
            if p.department:
                held[p.department] = held.get(p.department, 0) + ex.usage.get(p.name, 0)
        yield in_use
        yield quota
        yield deserved
        d_in_use, d_quota, d_limit = (DEPARTMENT_IN_USE.family(), DEPARTMENT_QUOTA.family(),
                                      DEPARTMENT_LIMIT.family())
        for d in self.store.quotas.departments():
            d_in_use.add_metric([d.name], held.get(d.name, 0) / GPU)
            d_quota.add_metric([d.name], d.quota / GPU)
            if d.limit is not None:
                d_limit.add_metric([d.name], d.limit / GPU)
        yield d_in_use
        yield d_quota
        yield d_limit
        past = getattr(self.scheduler, "past", None)
        if past is not None:  # fair share over time is on and has run a cycle
            borrowed = PROJECT_RECENT_BORROWED.family()
            for name, seconds in sorted(past.decayed(time.time()).items()):
                borrowed.add_metric([name], seconds)
            yield borrowed
        jobs = JOBS.family()
        counts: dict[tuple[str, str], int] = {}
        for row in self.store.jobs.active():
            key = (row.state, row.project)
            counts[key] = counts.get(key, 0) + 1
        for (state, project), n in sorted(counts.items()):
            jobs.add_metric([state, project], n)
        yield jobs


class _UsageCollector:
    """What the GPUs do (usage/): each GPU now, GPU-seconds since the service started."""

    def __init__(self, store, usage):
        self.store, self.usage = store, usage

    def collect(self):
        meter = self.usage.meter
        util, used, total = (GPU_UTILIZATION.family(), GPU_MEMORY_USED.family(),
                             GPU_MEMORY_TOTAL.family())
        held, lost, outside = GPU_ALLOCATED.family(), GPU_LOST.family(), GPU_OUTSIDE.family()
        for _at, use in meter.gpus_now():
            values = [use.node, use.uuid, use.pool or "other"]
            if use.utilization is not None:
                util.add_metric(values, use.utilization / 100)
            if use.memory_used is not None:
                used.add_metric(values, use.memory_used)
            total.add_metric(values, use.memory_total)
            held.add_metric(values, use.held / GPU)
            lost.add_metric(values, 1 if use.lost else 0)
            outside.add_metric(values, use.outside.processes)
        yield from (util, used, total, held, lost, outside)
        families = {"project": PROJECT_SECONDS.family(), "user": USER_SECONDS.family(),
                    "pool": POOL_SECONDS.family()}
        for (group, name), t in sorted(meter.counters.items()):
            kinds = ["allocated", "utilized", "idle"] + (["capacity"] if group == "pool" else [])
            for kind in kinds:
                families[group].add_metric([name, kind], getattr(t, kind) / GPU)
        yield from families.values()
        idle = JOBS_IDLE.family()
        flagged: dict[str, int] = {}
        idle_ids = meter.idle_jobs()
        for row in self.store.jobs.active():
            if row.id in idle_ids:
                flagged[row.project] = flagged.get(row.project, 0) + 1
        for project, n in sorted(flagged.items()):
            idle.add_metric([project], n)
        yield idle
        culler = self.usage.culler
        if culler is not None:
            culled = SLICES_CULLED.family()
            culled.add_metric([], culler.culled)
            yield culled
        notes = USAGE_PROBLEMS.family()
        notes.add_metric([], len(meter.notes()))
        yield notes


def render(store, scheduler, usage) -> str:
    """The exposition, read now from the store, the scheduler's last cycle and GPU use
    (``usage_service.GPUUsage``)."""
    registry = CollectorRegistry()
    registry.register(_PoolCollector(store, scheduler))
    registry.register(_UsageCollector(store, usage))
    return generate_latest(registry).decode()
