"""Prometheus metrics of the pool (text exposition format), computed when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..policy.model import GPU


class _PoolCollector:
    def __init__(self, pool):
        self.pool = pool

    def collect(self):
        ex = self.pool.scheduler.explained
        capacity = GaugeMetricFamily("gpushare_train_gpus", "GPUs in the train pool")
        capacity.add_metric([], sum(n.gpus for n in ex.nodes))
        yield capacity
        in_use = GaugeMetricFamily("gpushare_project_gpus_in_use", "GPUs a project's jobs hold",
                                   labels=["project"])
        quota = GaugeMetricFamily("gpushare_project_quota_gpus", "A project's guaranteed GPUs",
                                  labels=["project"])
        deserved = GaugeMetricFamily("gpushare_project_deserved_gpus",
                                     "A project's deserved share in the last cycle",
                                     labels=["project"])
        for p in self.pool.store.projects():
            in_use.add_metric([p.name], ex.usage.get(p.name, 0) / GPU)
            quota.add_metric([p.name], p.quota / GPU)
            deserved.add_metric([p.name], ex.deserved.get(p.name, 0) / GPU)
        yield in_use
        yield quota
        yield deserved
        jobs = GaugeMetricFamily("gpushare_jobs", "Jobs by state and project",
                                 labels=["state", "project"])
        counts: dict[tuple[str, str], int] = {}
        for row in self.pool.store.active():
            key = (row.state, row.project)
            counts[key] = counts.get(key, 0) + 1
        for (state, project), n in sorted(counts.items()):
            jobs.add_metric([state, project], n)
        yield jobs


class _UsageCollector:
    """What the GPUs do (usage/): each GPU now, GPU-seconds since the service started."""

    def __init__(self, pool):
        self.pool = pool

    def collect(self):
        meter = self.pool.usage.meter
        labels = ["node", "gpu", "pool"]
        util = GaugeMetricFamily("gpushare_gpu_utilization_ratio", "SM utilization of a GPU at "
                                 "its last reading (0-1); absent where NVML cannot say (MIG, a "
                                 "lost GPU)", labels=labels)
        used = GaugeMetricFamily("gpushare_gpu_memory_used_bytes", "GPU memory in use",
                                 labels=labels)
        total = GaugeMetricFamily("gpushare_gpu_memory_total_bytes", "GPU memory", labels=labels)
        held = GaugeMetricFamily("gpushare_gpu_allocated_ratio", "Share of a GPU held by jobs "
                                 "and slices (0-1)", labels=labels)
        lost = GaugeMetricFamily("gpushare_gpu_lost", "1 when NVML reports the GPU fallen off "
                                 "the bus", labels=labels)
        outside = GaugeMetricFamily("gpushare_gpu_outside_processes", "Processes on a GPU that "
                                    "no job or slice of gpushare owns", labels=labels)
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
        families = {
            "project": CounterMetricFamily(
                "gpushare_project_gpu_seconds", "GPU-seconds of a project's jobs since the "
                "service started: allocated (held), utilized (SM utilization x GPUs x time), "
                "idle (held below the idle threshold)", labels=["project", "kind"]),
            "user": CounterMetricFamily(
                "gpushare_user_gpu_seconds", "GPU-seconds of a user's jobs and build slices since "
                "the service started, as for projects", labels=["user", "kind"]),
            "pool": CounterMetricFamily(
                "gpushare_pool_gpu_seconds", "GPU-seconds of a pool since the service started: "
                "capacity (GPUs present x time), allocated, utilized, idle",
                labels=["pool", "kind"]),
        }
        for (group, name), t in sorted(meter.counters.items()):
            kinds = ["allocated", "utilized", "idle"] + (["capacity"] if group == "pool" else [])
            for kind in kinds:
                families[group].add_metric([name, kind], getattr(t, kind) / GPU)
        yield from families.values()
        idle = GaugeMetricFamily("gpushare_jobs_idle", "Running jobs whose GPUs have stayed "
                                 "below the idle threshold for idle_job_after",
                                 labels=["project"])
        flagged: dict[str, int] = {}
        idle_ids = meter.idle_jobs()
        for row in self.pool.store.active():
            if row.id in idle_ids:
                flagged[row.project] = flagged.get(row.project, 0) + 1
        for project, n in sorted(flagged.items()):
            idle.add_metric([project], n)
        yield idle
        culler = self.pool.usage.culler
        if culler is not None:
            culled = CounterMetricFamily("gpushare_slices_culled", "Notebook servers stopped "
                                         "because their build slice and kernels sat idle")
            culled.add_metric([], culler.culled)
            yield culled
        notes = GaugeMetricFamily("gpushare_usage_problems", "Sentences api/pool has about what "
                                  "could not be read (MIG, lost GPUs, no NVML, stray processes)")
        notes.add_metric([], len(meter.notes()))
        yield notes


def render(pool) -> str:
    registry = CollectorRegistry()
    registry.register(_PoolCollector(pool))
    registry.register(_UsageCollector(pool))
    return generate_latest(registry).decode()
