"""One configuration of the team scenario at one demand level, on the simulation's clock.

The configurations, deciding with the pool's own code throughout (``policy.cycle`` through
``engine.Simulator``, ``policy.place_slice``, ``usage.cull.decide``, ``policy/lending.py``):

- ``static``: each researcher owns whole GPUs and builds and trains on them only (the
  static policy: each researcher a project whose quota is its limit);
- ``pooled``: the build servers cut into slices for notebooks, the rest a train pool with
  guaranteed quotas per project and borrowing;
- ``gpushare``: pooled, and idle notebook servers culled, idle jobs reclaimed first, and build
  GPUs that hold no slice (beyond ``build_reserve``) lent to train jobs beyond their quota.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right

from ..policy.lending import build_node_of
from ..policy.model import BUILD, DEFAULT_MIN_RUNTIME_S, GPU, Node, PolicyConfig
from . import activity
from .engine import SimConfig, Simulator
from .metrics import percentile
from .team import DAY, HOUR, Researcher, TeamParameters, next_experiment
from .team_build import BuildSessions
from .trace import TraceJob

CONFIGS = ("static", "pooled", "gpushare")


class TeamRun:
    """One configuration of the team at one demand level, on the simulation's clock: the
    researchers' demand for training, on ``sim``, and their build servers, ``build``."""

    def __init__(self, p: TeamParameters, team: list[Researcher], jobs: list[tuple[int, float]],
                 config: str, demand: float, profile: str):
        self.p, self.team, self.jobs, self.config = p, team, jobs, config
        self.demand, self.profile = demand, profile
        self.by_name = {r.name: r for r in team}
        self.gpushare = config == "gpushare"
        servers = [Node(f"s{i}", g) for i, g in enumerate(p.servers)]
        if config == "static":
            self.train_nodes = tuple(servers)
            build_nodes: tuple[Node, ...] = ()
            quotas = {r.name: r.owned * GPU for r in team}
        else:
            cut = len(servers) - p.build_servers
            self.train_nodes = tuple(servers[:cut])
            build_nodes = tuple(Node(n.name, n.gpus, pool=BUILD) for n in servers[cut:])
            train = sum(n.gpus for n in self.train_nodes)
            share = [train // p.projects + (k < train % p.projects) for k in range(p.projects)]
            quotas = {f"p{k}": share[k] * GPU for k in range(p.projects)}
        self.sim = Simulator(
            [], quotas, SimConfig(
                sum(n.gpus for n in self.train_nodes), policy="static" if config == "static"
                else "guaranteed", grace_s=p.grace_s, checkpoint_interval_s=p.checkpoint_interval_s,
                cycle_interval_s=p.cycle_interval_s, idle_first=self.gpushare,
                policy_config=PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S)),
            nodes=self.train_nodes, spans=True)
        self.sim.stop_at = p.window_s
        self.sim.on_start, self.sim.on_end = self._started, self._ended
        self.build = BuildSessions(p, self.sim, self.train_nodes, build_nodes, self.gpushare)
        self.pending: dict[str, int] = {r.name: 0 for r in team}
        self.parked: dict[str, list[tuple[random.Random, int, float]]] = \
            {r.name: [] for r in team}
        """Experiments thought of while their researcher's queue was long: submitted when
        it is short again."""
        self.origin: dict[str, tuple[str, random.Random]] = {}  # job → its researcher, line
        self.submitted = 0

    # -- demand ----------------------------------------------------------------------
    def run(self) -> dict:
        for r in self.team:
            for k in range(r.lines):
                rng = random.Random(f"{self.p.seed}-{r.name}-{k}")
                self._think(r, rng, r.stretches[0][0] if r.stretches else math.inf)
            if self.config != "static":
                for i, (start, end) in enumerate(r.stretches):
                    self.sim.at(start, lambda t, r=r: self.build.arrive(r, t))
                    self.sim.at(end, lambda t, r=r, i=i: self.build.leave(r, i, t))
        self.sim.run()
        return self._figures()

    def _think(self, r: Researcher, rng: random.Random, t: float) -> None:
        """A line of work thinks from ``t`` and then submits its next experiment."""
        draw, pick, util = next_experiment(rng, len(self.jobs), self.profile)
        week = min(int(t // (7 * DAY)), self.p.weeks - 1) if math.isfinite(t) else 0
        rate = self.demand * r.weight * len(self.team) * r.week_factor[week]
        if rate <= 0:
            return
        ready = r.after_work(t, draw * self.p.think_h * HOUR / rate)
        if ready is not None and ready < self.p.window_s:
            self.sim.at(ready, lambda now: self._submit(r, rng, pick, util, now))

    def _submit(self, r: Researcher, rng: random.Random, pick: int, util: float,
                t: float) -> None:
        if self.pending[r.name] >= self.p.queue_short:  # their queue is long: wait for it
            self.parked[r.name].append((rng, pick, util))
            return
        gpus, duration = self.jobs[pick]
        cap = min(gpus, r.owned if self.config == "static" else self.p.max_gpus)
        self.submitted += 1
        job_id = f"{r.name}-{self.submitted:05d}"
        self.origin[job_id] = (r.name, rng)
        self.pending[r.name] += 1
        self.sim.add(TraceJob(job_id, t, duration * gpus / cap, cap * GPU,
                              r.name if self.config == "static" else r.project, r.name,
                              util=util))

    def _started(self, rec, t: float) -> None:
        name = self.origin[rec.trace.id][0]
        self.pending[name] -= 1
        if self.gpushare:
            self.build.hold(rec.trace.id, self.sim.active.get(rec.trace.id).placement)
        parked = self.parked.get(name)
        if parked and self.pending[name] < self.p.queue_short:
            rng, pick, util = parked.pop(0)
            r = self.by_name[name]
            when = t if r.at_work(t) is not None else r.after_work(t, 0.0)
            if when is not None and when < self.p.window_s:
                self.sim.at(when, lambda now: self._submit(r, rng, pick, util, now))

    def _ended(self, rec, t: float) -> None:
        name, rng = self.origin[rec.trace.id]
        if rec.finish is not None:
            self._think(self.by_name[name], rng, t)
        else:  # preempted and requeued: it waits in its researcher's queue again
            self.pending[name] += 1
        self.build.job_ended(rec.trace.id, t)

    # -- figures ---------------------------------------------------------------------
    def _figures(self) -> dict:
        p, end = self.p, self.p.window_s
        bins = math.ceil(end / HOUR)
        series = {k: [0.0] * bins for k in ("train", "build")}
        train_util = build_util = train_alloc = build_alloc = idle = 0.0
        spans = list(self.sim.spans)
        for rec in self.sim.records.values():  # attempts still running at the end
            if rec.attempt_start is not None and rec.finish is None:
                job = self.sim.active.get(rec.trace.id)
                spans.append((rec.attempt_start, end, rec.trace.id, rec.trace.gpus, rec.util,
                              tuple(job.placement)))
        for start, stop, _, milli, util, nodes in spans:
            stop = min(stop, end)
            if stop <= start:
                continue
            gpus = milli / GPU * (stop - start)
            on_build = any(build_node_of(n) for n in nodes)
            if on_build:
                build_util += gpus * util
                build_alloc += gpus
            else:
                train_util += gpus * util
                train_alloc += gpus
            if util < activity.IDLE_THRESHOLD:
                idle += gpus
            _spread(series["build" if on_build else "train"], start, stop, milli / GPU * util)
        session_util = session_alloc = busy_s = 0.0
        burst = p.session.burst_gpu
        if self.config == "static":
            for r in self.team:
                for a, b in r.bursts:
                    session_util += burst * (b - a)
                    busy_s += b - a
                    _spread(series["build"], a, b, burst)
        else:
            for name, a, b in self.build.slice_spans(end):
                r = self.by_name[name]
                session_alloc += p.slice_gpu * (b - a)
                for x, y in r.bursts[bisect_right(r.burst_ends, a):]:
                    if x >= b:
                        break
                    x, y = max(x, a), min(y, b)
                    session_util += burst * (y - x)
                    busy_s += y - x
                    _spread(series["build"], x, y, burst)
                idle += p.slice_gpu * (b - a)
            idle -= p.slice_gpu * busy_s
        capacity = p.gpus * end
        utilized = train_util + build_util + session_util
        if self.config == "static":  # every GPU is someone's, all the time
            allocated = capacity
            busy = sum(milli / GPU * (min(b, end) - a) for a, b, _, milli, u, _ in spans
                       if u >= activity.IDLE_THRESHOLD and b > a) + busy_s
            idle = max(0.0, capacity - busy)
        else:
            allocated = train_alloc + build_alloc + session_alloc
        done = [r for r in self.sim.records.values() if r.finish is not None and r.finish <= end]
        jct = [r.finish - r.trace.submit_time for r in done]
        build_gpus = sum(n.gpus for n in self.build.build_nodes) * end
        train_gpus = sum(n.gpus for n in self.train_nodes) * end
        return {
            "avg_utilization": round(utilized / capacity, 4),
            "allocation": round(allocated / capacity, 4),
            "idle_allocated": round(idle / allocated, 4) if allocated else 0.0,
            "experiments_completed": len(done),
            "experiments_submitted": len(self.sim.records),
            "train_gpu_hours": round((train_alloc + build_alloc) / HOUR, 1),
            "median_jct_s": round(percentile(jct, 50), 1),
            "p95_jct_s": round(percentile(jct, 95), 1),
            "avg_queue_s": round(sum(r.queued_s for r in done) / len(done), 1) if done else 0.0,
            "preemptions": sum(r.preemptions for r in self.sim.records.values()),
            "max_build_wait_s": round(max(self.build.waits, default=0.0), 1),
            "build_waits": sum(w > 0 for w in self.build.waits),
            "culls": self.build.culls,
            "pools": {} if self.config == "static" else {
                "build": {"gpus": sum(n.gpus for n in self.build.build_nodes),
                          "avg_utilization": round((build_util + session_util) / build_gpus, 4),
                          "allocation": round((build_alloc + session_alloc) / build_gpus, 4),
                          "lent_gpu_hours": round(build_alloc / HOUR, 1)},
                "train": {"gpus": sum(n.gpus for n in self.train_nodes),
                          "avg_utilization": round(train_util / train_gpus, 4),
                          "allocation": round(train_alloc / train_gpus, 4)}},
            "series": [round(sum(v) / p.gpus, 4) for v in zip(series["train"], series["build"])],
        }


def _spread(bins: list[float], start: float, stop: float, amount: float) -> None:
    """Add ``amount`` GPUs over [start, stop) to hourly ``bins``, as GPU-hours per hour."""
    h = int(start // HOUR)
    while start < stop and h < len(bins):
        upto = min(stop, (h + 1) * HOUR)
        bins[h] += amount * (upto - start) / HOUR
        start, h = upto, h + 1
