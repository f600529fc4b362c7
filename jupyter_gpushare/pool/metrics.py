"""Prometheus metrics of the pool (text exposition format), computed when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

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


def render(pool) -> str:
    registry = CollectorRegistry()
    registry.register(_PoolCollector(pool))
    return generate_latest(registry).decode()
