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

from ..policy import SliceRefused
from ..policy.lending import Want, build_node_of, lendable, lent_node, take_slice
from ..policy.model import BUILD, DEFAULT_MIN_RUNTIME_S, GPU, Node, PolicyConfig, Slice
from ..usage.cull import CullSettings, Evidence, decide
from . import activity
from .engine import SimConfig, Simulator
from .metrics import percentile
from .team import DAY, HOUR, Researcher, TeamParameters, next_experiment
from .trace import TraceJob

CONFIGS = ("static", "pooled", "gpushare")


class TeamRun:
    """One configuration of the team at one demand level, on the simulation's clock."""

    def __init__(self, p: TeamParameters, team: list[Researcher], jobs: list[tuple[int, float]],
                 config: str, demand: float, profile: str):
        self.p, self.team, self.jobs, self.config = p, team, jobs, config
        self.demand, self.profile = demand, profile
        self.by_name = {r.name: r for r in team}
        self.gpushare = config == "gpushare"
        servers = [Node(f"s{i}", g) for i, g in enumerate(p.servers)]
        if config == "static":
            self.train_nodes = tuple(servers)
            self.build_nodes: tuple[Node, ...] = ()
            quotas = {r.name: r.owned * GPU for r in team}
        else:
            cut = len(servers) - p.build_servers
            self.train_nodes = tuple(servers[:cut])
            self.build_nodes = tuple(Node(n.name, n.gpus, pool=BUILD) for n in servers[cut:])
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
        self.cull = CullSettings(p.cull_after_s, p.cull_warning_s)
        self.slices: dict[str, Slice] = {}  # researcher → the slice of their open server
        self.opened: dict[str, float] = {}  # researcher → when their server got its slice
        self.held: list[tuple[str, float, float]] = []  # (researcher, from, to) of each slice
        self.waiting: dict[str, float] = {}  # researcher → since when their server waits
        self.waits: list[float] = []
        self.warned: dict[str, float] = {}
        self.culls = 0
        self.lent: dict[str, int] = {}  # build server → GPUs lent now
        self.holder: dict[tuple[str, int], str] = {}  # lent build GPU → the job on it
        self.gpus_of: dict[str, list[tuple[str, int]]] = {}  # job → the lent GPUs it holds
        self.wanted: dict[str, tuple[str, int]] = {}  # researcher → the lent GPU taken back
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
                    self.sim.at(start, lambda t, r=r: self._arrive(r, t))
                    self.sim.at(end, lambda t, r=r, i=i: self._leave(r, i, t))
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
            self._hold(rec.trace.id, self.sim.active.get(rec.trace.id).placement)
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
        for gpu in self.gpus_of.pop(rec.trace.id, ()):
            del self.holder[gpu]
        if self.gpushare:
            self._place_waiting(t)

    # -- build sessions ----------------------------------------------------------------
    def _arrive(self, r: Researcher, t: float) -> None:
        if r.name in self.warned:  # back at work: the culler's own rule spares the server
            decide([self._evidence(r, t, hub_idle=0.0)], self.warned, t, self.cull)
            del self.warned[r.name]
        if r.name in self.slices or r.name in self.waiting:
            return
        self.waiting[r.name] = t
        self._place_waiting(t)

    def _leave(self, r: Researcher, i: int, t: float) -> None:
        if r.name in self.waiting:  # left before a slice came
            self.waits.append(t - self.waiting.pop(r.name))
            self.wanted.pop(r.name, None)
            self._lend(t)
            return
        rng = random.Random(f"{self.p.seed}-{r.name}-leave-{i}")
        if rng.random() >= self.p.leave_open:
            self._close(r, t)
        elif self.gpushare and self.p.cull_after_s > 0:
            self.sim.at(t + self.p.cull_after_s, lambda now: self._cull_round(r, i, now))

    def _cull_round(self, r: Researcher, i: int, t: float) -> None:
        """What the pool's culler decides about ``r``'s server, left open after stretch ``i``."""
        if r.name not in self.slices or r.at_work(t) is not None or \
                bisect_right(r.starts, t) - 1 != i:
            return
        for d in decide([self._evidence(r, t, hub_idle=t - r.stretches[i][1])], self.warned,
                        t, self.cull):
            if d.kind == "warn":
                self.warned[r.name] = t
                self.sim.at(t + self.p.cull_warning_s, lambda now: self._cull_round(r, i, now))
            elif d.kind == "cull":
                del self.warned[r.name]
                self.culls += 1
                self._close(r, t)

    def _evidence(self, r: Researcher, t: float, hub_idle: float) -> Evidence:
        last, busy = activity.last_burst_end(r.bursts, r.burst_ends, t)
        since = max(last or 0.0, self.opened.get(r.name, t))
        return Evidence(r.name, "", r.name, None if busy else t - since, hub_idle,
                        1 if busy else 0, 0.0, False)

    def _close(self, r: Researcher, t: float) -> None:
        if r.name in self.slices:
            del self.slices[r.name]
            self.held.append((r.name, self.opened.pop(r.name), t))
            self._place_waiting(t)

    # -- slices and lent GPUs: the rules of pool/build/build_pool.py and pool/train/scheduler.py, GPU by GPU -----
    def _place_waiting(self, t: float) -> None:
        """Give waiting servers their slices by the service's rule (``policy.lending
        .take_slice``, as ``BuildPool.reserve`` calls it): packed best fit on GPUs that no
        train job holds and no other server wants; where only a GPU a job holds has room, the
        server wants the one packing picks, and its job is stopped (``PoolLoop._take_back``):
        the slice comes when the job has left, after its grace."""
        milli = round(self.p.slice_gpu * GPU)
        for name in sorted(self.waiting, key=self.waiting.get):
            slices = list(self.slices.values())
            # another server's wanted GPU is fenced by its slice, as BuildPool.reserve does
            others = [Slice("", who, milli, *gpu) for who, gpu in self.wanted.items()
                      if who != name]
            where = take_slice(self.build_nodes, slices, name, milli, others=others,
                               held=self.holder, may_want=self.gpushare)
            if isinstance(where, SliceRefused):
                continue  # the build pool is full: the server waits for a slice to end
            if isinstance(where, Want):
                if name not in self.wanted:
                    self.wanted[name] = gpu = tuple(where)
                    if gpu in self.holder:
                        self.sim.stop(t, self.holder[gpu])
                continue
            self.wanted.pop(name, None)
            self.slices[name] = Slice(name, name, milli, where.node, where.gpu)
            self.opened[name] = t
            self.waits.append(t - self.waiting.pop(name))
        self._lend(t)

    def _lendable(self) -> list[tuple[str, int]]:
        """The build GPUs lent now, by the service's rule (``policy.lending.lendable``, as
        ``BuildPool.lendable`` calls it)."""
        return lendable(self.build_nodes, {(s.node, s.gpu) for s in self.slices.values()},
                        set(self.wanted.values()), self.holder, self.p.build_reserve)

    def _lend(self, t: float) -> None:
        """One lent train node per build server, of its GPUs lent now (``lent_nodes``)."""
        if not self.gpushare:
            return
        count: dict[str, int] = {}
        for node, _ in self._lendable():
            count[node] = count.get(node, 0) + 1
        if count != self.lent:
            self.lent = count
            self.sim.nodes = self.train_nodes + tuple(
                Node(lent_node(name), n, lent=True) for name, n in sorted(count.items()))
            self.sim.changed(t)

    def _hold(self, job_id: str, placement) -> None:
        """A job started on lent GPUs takes the first lent ones no job holds."""
        for name, milli in placement.items():
            node = build_node_of(name)
            if node is None:
                continue
            free = [g for g in self._lendable() if g[0] == node and g not in self.holder]
            for gpu in free[:milli // GPU]:
                self.holder[gpu] = job_id
                self.gpus_of.setdefault(job_id, []).append(gpu)

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
            open_now = [(n, self.opened[n], end) for n in self.slices]
            for name, a, b in self.held + open_now:
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
        build_gpus = sum(n.gpus for n in self.build_nodes) * end
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
            "max_build_wait_s": round(max(self.waits, default=0.0), 1),
            "build_waits": sum(w > 0 for w in self.waits),
            "culls": self.culls,
            "pools": {} if self.config == "static" else {
                "build": {"gpus": sum(n.gpus for n in self.build_nodes),
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
