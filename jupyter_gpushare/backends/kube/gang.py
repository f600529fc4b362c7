"""One attempt on Kubernetes as the backend tracks it: a gang of pods, one per node, and how
their states read as the attempt's end. One life: the first rank that fails or vanishes ends
the gang (the backend stops the other pods), and the attempt ends when no pod runs any more.
No I/O here."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...trainjob import FAILED, SUCCEEDED
from ..base import LOST, Exit
from .objects import ENDED, GONE, RANKS, PodState


@dataclass(frozen=True)
class PodRanks:
    """The ranks one pod runs: ``first`` and ``count``; ``prefixed`` when a per-GPU pod's
    launcher writes them all into its log, each line after ``[rank N] ``."""

    name: str
    first: int
    count: int = 1
    prefixed: bool = False

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def record(self) -> dict:
        return {"name": self.name, "first": self.first, "count": self.count,
                "prefixed": self.prefixed}

    @classmethod
    def from_record(cls, record: dict) -> "PodRanks":
        return cls(str(record["name"]), int(record["first"]), int(record.get("count", 1)),
                   bool(record.get("prefixed", False)))

    @classmethod
    def of_pod(cls, pod: dict, node_rank: int) -> "PodRanks":
        """From a manifest: a per-GPU pod says its ranks in an annotation."""
        said = (pod["metadata"].get("annotations") or {}).get(RANKS)
        if said:
            first, last = (int(x) for x in said.split("-"))
            return cls(pod["metadata"]["name"], first, last - first + 1, True)
        return cls(pod["metadata"]["name"], node_rank)


def layout_of(records) -> tuple[PodRanks, ...]:
    """Pods from a handle or an exit record; an older record lists names only (a rank each)."""
    out = []
    for i, record in enumerate(records or ()):
        out.append(PodRanks(str(record), i) if isinstance(record, str)
                   else PodRanks.from_record(record))
    return tuple(out)


@dataclass
class Gang:
    job_id: str
    attempt: int
    pods: tuple[PodRanks, ...]  # in node-rank order; pods[0] runs rank 0
    placement: dict[str, int]
    created_at: float  # time.monotonic() when its pods existed; -inf when adopted
    rendezvous: str | None = None  # its Service and NetworkPolicy, for a multi-node gang
    waiting: frozenset[str] = frozenset()  # pods created once rank 0 has its IP ("pod-ip")
    later: Callable[[str], list[dict]] | None = None  # rank 0's IP -> their manifests
    stopping: bool = False
    grace: int = 0  # the grace period its stop gave its pods
    failure: Exit | None = None  # the first rank that ended badly: the others are stopping
    followers: dict[int, asyncio.Task] = field(default_factory=dict)  # pod index -> its log
    keepers: dict[int, asyncio.Task] = field(default_factory=dict)  # ended pods: log, delete
    lent: dict[str, tuple[int, ...]] = field(default_factory=dict)  # build node -> its GPUs lent to the gang

    @property
    def key(self):
        return (self.job_id, self.attempt)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pods)

    @property
    def world_size(self) -> int:
        return sum(p.count for p in self.pods)

    def handle_data(self, namespace: str) -> dict:
        return {"namespace": namespace, "pods": list(self.names),
                "ranks": [p.record() for p in self.pods], "placement": dict(self.placement),
                "rendezvous": self.rendezvous,
                **({"lent": {n: list(g) for n, g in self.lent.items()}} if self.lent else {})}


def judge(gang: Gang, states: Sequence[PodState]) -> Exit | None:
    """The attempt's end from its pods' states (in ``gang.pods`` order), or None while one
    may still run. The first pod found failed or gone becomes ``gang.failure``; the caller
    stops the others, and the failure is the attempt's end once they are gone."""
    settled = all(s.phase in (GONE, *ENDED) for s in states)
    if gang.stopping:
        if not settled:
            return None
        if all(s.phase == SUCCEEDED for s in states):  # finished by itself within the grace
            return Exit(gang.job_id, gang.attempt, SUCCEEDED, 0)
        code = next((s.exit_code for s in states if s.exit_code), None)
        return Exit(gang.job_id, gang.attempt, FAILED, code, "stopped")
    if gang.failure is None:
        for pod, s in zip(gang.pods, states):
            if s.phase in (FAILED, GONE):
                reason = _named(gang, pod, s.reason)
                gang.failure = Exit(gang.job_id, gang.attempt, FAILED, s.exit_code, reason) \
                    if s.phase == FAILED else Exit(gang.job_id, gang.attempt, LOST,
                                                     reason=reason)
                break
    if gang.failure is not None:
        return gang.failure if settled else None
    if all(s.phase == SUCCEEDED for s in states):
        return Exit(gang.job_id, gang.attempt, SUCCEEDED, 0)
    return None


def _named(gang: Gang, pod: PodRanks, reason: str) -> str:
    """The reason, naming the rank(s) when the gang has several."""
    if gang.world_size == 1:
        return reason
    who = f"rank {pod.first}" if pod.count == 1 else f"ranks {pod.first}-{pod.last}"
    return f"{who}: {reason}"
