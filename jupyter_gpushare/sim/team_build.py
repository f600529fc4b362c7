"""The team scenario's build servers: notebook servers opening and closing their slices,
the culler's rounds, and build GPUs lent to train jobs and taken back, GPU by GPU, by the
pool's own rules (``policy.lending.take_slice`` and ``lendable``, ``usage.cull.decide``,
the loop's take-back through ``Simulator.stop``). ``TeamRun`` drives it on the
simulation's clock.
"""

from __future__ import annotations

import random
from bisect import bisect_right

from ..policy import SliceRefused
from ..policy.lending import Want, build_node_of, lendable, lent_node, take_slice
from ..policy.model import GPU, Node, Slice
from ..usage.cull import CullSettings, Evidence, decide
from . import activity
from .engine import Simulator
from .team import Researcher, TeamParameters


class BuildSessions:
    """The build pool of one configuration: ``lending`` (gpushare) lends its GPUs that hold
    no slice, beyond ``build_reserve``, and culls servers left idle."""

    def __init__(self, p: TeamParameters, sim: Simulator, train_nodes: tuple[Node, ...],
                 build_nodes: tuple[Node, ...], lending: bool):
        self.p, self.sim, self.lending = p, sim, lending
        self.train_nodes, self.build_nodes = train_nodes, build_nodes
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

    # -- sessions ----------------------------------------------------------------------
    def arrive(self, r: Researcher, t: float) -> None:
        if r.name in self.warned:  # back at work: the culler's own rule spares the server
            decide([self._evidence(r, t, hub_idle=0.0)], self.warned, t, self.cull)
            del self.warned[r.name]
        if r.name in self.slices or r.name in self.waiting:
            return
        self.waiting[r.name] = t
        self.place_waiting(t)

    def leave(self, r: Researcher, i: int, t: float) -> None:
        if r.name in self.waiting:  # left before a slice came
            self.waits.append(t - self.waiting.pop(r.name))
            self.wanted.pop(r.name, None)
            self._lend(t)
            return
        rng = random.Random(f"{self.p.seed}-{r.name}-leave-{i}")
        if rng.random() >= self.p.leave_open:
            self._close(r, t)
        elif self.lending and self.p.cull_after_s > 0:
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
            self.place_waiting(t)

    # -- slices and lent GPUs: the rules of pool/build.py and pool/loop.py, GPU by GPU -----
    def place_waiting(self, t: float) -> None:
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
                               held=self.holder, may_want=self.lending)
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
        if not self.lending:
            return
        count: dict[str, int] = {}
        for node, _ in self._lendable():
            count[node] = count.get(node, 0) + 1
        if count != self.lent:
            self.lent = count
            self.sim.nodes = self.train_nodes + tuple(
                Node(lent_node(name), n, lent=True) for name, n in sorted(count.items()))
            self.sim.changed(t)

    def hold(self, job_id: str, placement) -> None:
        """A job started on lent GPUs takes the first lent ones no job holds."""
        for name, milli in placement.items():
            node = build_node_of(name)
            if node is None:
                continue
            free = [g for g in self._lendable() if g[0] == node and g not in self.holder]
            for gpu in free[:milli // GPU]:
                self.holder[gpu] = job_id
                self.gpus_of.setdefault(job_id, []).append(gpu)

    def job_ended(self, job_id: str, t: float) -> None:
        """A job's attempt ended: the lent GPUs it held are free for slices again."""
        for gpu in self.gpus_of.pop(job_id, ()):
            del self.holder[gpu]
        if self.lending:
            self.place_waiting(t)

    def slice_spans(self, end: float) -> list[tuple[str, float, float]]:
        """Each slice held during the run, those still open counted to ``end``."""
        return self.held + [(n, self.opened[n], end) for n in self.slices]
