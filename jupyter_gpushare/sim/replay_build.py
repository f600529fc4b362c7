"""The build pool in a replay of the pool's history: its recorded notebook sessions
(``slice_history.py``, sent by ``api/history`` as its ``build`` part) open and close at their
times, and where the pool lends build GPUs, those without slices are lent to train jobs and
taken back by the pool's own rules, GPU by GPU, as ``pool/build/build_pool.py`` and the
loop apply them: ``policy.lending.take_slice`` (where a slice goes, or which lent GPU its
server wants), ``lendable`` (what is lent: the reserve kept, GPUs resting after a take-back
left out), ``take_back_wait`` (one user's take-backs within a window), and the take-back
itself through ``Simulator.stop``. ``history.replay`` drives it on the simulation's clock.

A server that took a lent GPU back and then gave up (no slice followed) is replayed as that
take-back alone: the job on the GPU is stopped and the GPU rests, as in the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..policy import SliceRefused
from ..policy.lending import Want, build_node_of, lendable, lent_node, take_back_wait, take_slice
from ..policy.model import BUILD, GPU, Node, Slice
from .engine import Simulator
from .slice_history import MAX_SESSIONS

MAX_BUILD_NODES = 10_000
GPUKey = tuple[str, int]


@dataclass(frozen=True)
class BuildSettings:
    """The build pool a replay lends from: its nodes and the pool's lending options
    (``PoolService.build_reserve``, ``lend_again_after``, ``take_backs_per_user``,
    ``take_back_window``, ``build_allowance``), as ``api/history`` sends them."""

    nodes: tuple[Node, ...]
    allowance: int = GPU // 2  # milli-GPUs of slices one user may hold
    reserve: int = 1
    lend_again_after_s: float = 300.0
    take_backs_per_user: int = 2
    take_back_window_s: float = 600.0
    sessions_left_off: int = 0
    """Sessions beyond what one history gives (``slice_history.MAX_SESSIONS``)."""

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


class Session(NamedTuple):
    """A notebook server's slice, in the replay's time: asked for at ``asked``, given up at
    ``end`` (None: still open)."""

    id: str
    user: str
    milli: int
    asked: float
    end: float | None


class TakenBack(NamedTuple):
    """A take-back that no session followed: at ``at``, GPU ``gpu`` of ``node``, for ``user``."""

    at: float
    user: str
    node: str
    gpu: int


# -- what api/history sends, checked -----------------------------------------------------------

class BadBuild(ValueError):
    """The history's ``build`` part cannot be replayed, in one sentence."""


def _number(block: dict, name: str, default, *, whole: bool = False, least: float = 0.0):
    value = block.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < least or (whole and value != int(value)):
        kind = "a whole number" if whole else "a number"
        raise BadBuild(f"the history's build {name} must be {kind} from {least:g}, not "
                       f"{str(value)[:40]}")
    return int(value) if whole else float(value)


def _text(item: dict, name: str, what: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= 255:
        raise BadBuild(f"each {what} of the history's build part needs {name}, a text of 1 "
                       f"to 255 characters")
    return value


def build_from(block) -> tuple[BuildSettings, list[dict], list[dict]]:
    """The build pool, its sessions (``kind=build`` lines) and its take-backs from
    ``api/history``'s ``build`` part; ``BadBuild`` with one sentence for anything else."""
    if not isinstance(block, dict):
        raise BadBuild("the history's build part must be an object")
    nodes = block.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_BUILD_NODES or \
            not all(isinstance(n, dict) for n in nodes):
        raise BadBuild("the history's build nodes must be a list of {\"name\", \"gpus\"}")
    built = tuple(Node(_text(n, "name", "node"), _number(n, "gpus", None, whole=True),
                       pool=BUILD) for n in nodes)
    settings = BuildSettings(
        built, allowance=round(_number(block, "allowance", 0.5) * GPU),
        reserve=_number(block, "reserve", 1, whole=True),
        lend_again_after_s=_number(block, "lend_again_after_s", 300.0),
        take_backs_per_user=_number(block, "take_backs_per_user", 2, whole=True, least=1),
        take_back_window_s=_number(block, "take_back_window_s", 600.0),
        sessions_left_off=_number(block, "sessions_left_off", 0, whole=True))
    lines, backs = block.get("sessions", []), block.get("take_backs", [])
    for name, items in (("sessions", lines), ("take_backs", backs)):
        if not isinstance(items, list) or len(items) > MAX_SESSIONS or \
                not all(isinstance(i, dict) for i in items):
            raise BadBuild(f"the history's build {name} must be a list of at most "
                           f"{MAX_SESSIONS} objects")
    for s in lines:
        _text(s, "job_id", "session")
        _text(s, "user", "session")
        if not 0 < _number(s, "gpus", None) <= 1:
            raise BadBuild(f"a session's gpus must be a fraction of one GPU, not {s['gpus']}")
        _number(s, "submitted", None)
        _number(s, "duration", None)
        if s.get("state") not in ("open", "closed"):
            raise BadBuild("a session's state must be open or closed")
    for b in backs:
        _number(b, "at", None)
        _number(b, "gpu", None, whole=True)
        _text(b, "user", "take-back")
        _text(b, "node", "take-back")
    return settings, lines, backs


def timed(lines: list[dict], backs: list[dict], first: float
          ) -> tuple[list[Session], list[TakenBack]]:
    """Sessions and the take-backs no session followed, in seconds from ``first`` (the
    replay's first submit); those over before it are left out."""
    sessions = []
    for s in lines:
        asked = s["submitted"] - first
        end = None if s["state"] == "open" else asked + s["duration"]
        if end is None or end > 0:
            sessions.append(Session(s["job_id"], s["user"], round(s["gpus"] * GPU),
                                    max(0.0, asked), end))
    alone = [TakenBack(b["at"] - first, b["user"], b["node"], int(b["gpu"])) for b in backs
             if b.get("session") is None and b["at"] >= first]
    return sessions, alone


# -- the replay ---------------------------------------------------------------------------------

class RecordedBuild:
    """The build pool of one replay on ``sim`` (whose own nodes are ``train_nodes``):
    ``sessions`` ask for slices and end at their times; with ``lend``, build GPUs without
    slices are lent by the pool's rules. Replaces ``sim``'s ``on_start`` and ``on_end``."""

    def __init__(self, sim: Simulator, train_nodes: tuple[Node, ...], build: BuildSettings,
                 sessions: list[Session], alone: list[TakenBack], lend: bool, grace_s: float):
        self.sim, self.train_nodes, self.build, self.lend = sim, train_nodes, build, lend
        self.grace_s = grace_s
        self.session = {s.id: s for s in sessions}
        self.slices: dict[str, Slice] = {}  # session → its slice
        self.waiting: dict[str, float] = {}  # session → since when it waits for a slice
        self.wanted: dict[str, GPUKey] = {}  # waiting session → the lent GPU it wants back
        self.alone: dict[int, GPUKey] = {}  # a take-back no session followed → its GPU
        self.holder: dict[GPUKey, str] = {}  # lent build GPU → the job on it
        self.gpus_of: dict[str, list[GPUKey]] = {}  # job → the lent GPUs it holds
        self.resting: dict[GPUKey, float] = {}  # GPU taken back → when it may be lent again
        self.took: dict[str, list[float]] = {}  # user → when their servers took GPUs back
        self.lent_now: dict[str, list[GPUKey]] = {}  # build node → its GPUs lent now
        self.lent_nodes: tuple[Node, ...] = ()
        self.take_backs = 0
        sim.on_start, sim.on_end = self._started, self._ended
        sim.at(0.0, self._lend)
        for s in sessions:
            sim.at(s.asked, lambda t, s=s: self.ask(s.id, t))
            if s.end is not None:
                sim.at(max(s.end, s.asked), lambda t, s=s: self.leave(s.id, t))
        for i, tb in enumerate(alone):
            sim.at(tb.at, lambda t, i=i, tb=tb: self._want_alone(i, tb, t))

    # -- sessions ----------------------------------------------------------------------
    def ask(self, sid: str, t: float) -> None:
        self.waiting[sid] = t
        self.place_waiting(t)

    def leave(self, sid: str, t: float) -> None:
        if self.waiting.pop(sid, None) is not None:  # gave up before its slice came
            self.wanted.pop(sid, None)
            self._lend(t)
        elif self.slices.pop(sid, None) is not None:
            self.place_waiting(t)

    def _want_alone(self, i: int, tb: TakenBack, t: float) -> None:
        """A take-back whose server gave up: its GPU wanted for the grace period."""
        gpu = (tb.node, tb.gpu)
        self.alone[i] = gpu
        self._take_back(gpu, tb.user, t)
        self.sim.at(t + self.grace_s, lambda now: self._given_up(i, now))
        self._lend(t)

    def _given_up(self, i: int, t: float) -> None:
        del self.alone[i]
        self.place_waiting(t)

    def place_waiting(self, t: float) -> None:
        """Give waiting servers their slices by ``BuildPool.reserve``'s rule
        (``policy.lending.take_slice``): packed on GPUs no job holds; where only a lent GPU
        a job holds has room, the server wants it back (one at a time per user, within the
        user's take-backs), and the job there is stopped as the loop stops it."""
        for sid in sorted(self.waiting, key=lambda k: (self.waiting[k], k)):
            s = self.session[sid]
            others = [Slice("", self.session[o].user, self.session[o].milli, *gpu)
                      for o, gpu in self.wanted.items() if o != sid]
            others += [Slice("", "", GPU, *gpu) for gpu in self.alone.values()]
            own = [Slice("", s.user, self.session[o].milli, "", -1) for o in self.wanted
                   if o != sid and self.session[o].user == s.user]
            not_now = SliceRefused("another server of the user takes back a GPU") \
                if own else None
            where = take_slice(self.build.nodes, list(self.slices.values()), s.user, s.milli,
                               self.build.allowance, others=others, held=self.holder,
                               own_waiting=own, may_want=self.lend, not_now=not_now)
            if isinstance(where, SliceRefused):
                continue  # full, or beyond the allowance: it waits for a slice to end
            if isinstance(where, Want):
                gpu = tuple(where)
                if sid in self.wanted:
                    continue  # it wants the GPU it first wanted, until that is free
                if gpu in self.holder and take_back_wait(
                        self.took.get(s.user, ()), t, self.build.take_backs_per_user,
                        self.build.take_back_window_s) > 0:
                    continue  # beyond the user's take-backs: only a free GPU will do
                self.wanted[sid] = gpu
                self._take_back(gpu, s.user, t)
                continue
            self.wanted.pop(sid, None)
            del self.waiting[sid]
            self.slices[sid] = Slice(sid, s.user, s.milli, where.node, where.gpu)
        self._lend(t)

    def _take_back(self, gpu: GPUKey, user: str, t: float) -> None:
        """The loop's take-back (``Scheduler._take_back``, ``BuildPool.took_back``): the job
        on a wanted GPU is stopped, counted against the user, and the GPU rests."""
        job_id = self.holder.get(gpu)
        job = self.sim.active.get(job_id) if job_id is not None else None
        if job is None or not job.running or job.preempting:
            return
        self.take_backs += 1
        self.took.setdefault(user, []).append(t)
        if self.build.lend_again_after_s > 0:
            self.resting[gpu] = t + self.build.lend_again_after_s
            self.sim.at(t + self.build.lend_again_after_s, self._lend)
        self.sim.stop(t, job_id)

    # -- lent GPUs ---------------------------------------------------------------------
    def _lend(self, t: float) -> None:
        """One lent train node per build node with GPUs lent now or jobs still on them, of
        the GPUs ``lendable`` gives (``BuildPool.lent_nodes``)."""
        resting = {g for g, until in self.resting.items() if until > t}
        taken = set(self.wanted.values()) | set(self.alone.values())
        lent = lendable(self.build.nodes, {(s.node, s.gpu) for s in self.slices.values()},
                        taken, self.holder, self.build.reserve, resting=resting) \
            if self.lend else []
        self.lent_now = {}
        for node, gpu in lent:
            self.lent_now.setdefault(node, []).append((node, gpu))
        held = {node for node, _ in self.holder}
        nodes = tuple(Node(lent_node(n.name), len(self.lent_now.get(n.name, ())), lent=True)
                      for n in self.build.nodes if n.name in self.lent_now or n.name in held)
        if nodes != self.lent_nodes:
            self.lent_nodes = nodes
            self.sim.nodes = self.train_nodes + nodes
            self.sim.changed(t)

    def _started(self, rec, t: float) -> None:
        """A job placed on a lent node takes its lowest lent GPUs that no job holds and no
        server wants (the local backend's choice)."""
        placement = self.sim.active.get(rec.trace.id).placement
        for name, milli in placement.items():
            node = build_node_of(name)
            if node is None:
                continue
            free = [g for g in self.lent_now.get(node, ()) if g not in self.holder]
            for gpu in free[:milli // GPU]:
                self.holder[gpu] = rec.trace.id
                self.gpus_of.setdefault(rec.trace.id, []).append(gpu)

    def _ended(self, rec, t: float) -> None:
        """An attempt ended: the lent GPUs it held are free for slices again."""
        for gpu in self.gpus_of.pop(rec.trace.id, ()):
            del self.holder[gpu]
        self.place_waiting(t)
