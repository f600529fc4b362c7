"""Whose is a pod: a train job's attempt (and which of its node ranks), a notebook server's
build slices, or nobody's in gpushare. Pure: pod objects (the API's JSON) in, owners out.

- A train job's pod (``backends/kube/objects.py``) is labelled managed-by jupyter-gpushare,
  component train-job, with its job, attempt and node rank.
- A notebook pod of ``GPUShareKubeSpawner`` names its build slices in the annotation
  ``gpushare.jupyter.org/slices`` ("s-1a2b3c4d", or several, comma-separated, for a server
  with more than one GPU).
The agent only *claims*; the pool believes a claim only where that job attempt runs, or that
slice is, on the agent's node (``pool/web/api_usage.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..backends.kube.objects import ATTEMPT, COMPONENT, JOB, MANAGED_BY, MANAGER, RANK, SLICES

MAX_SLICES = 8
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


@dataclass(frozen=True, slots=True)
class PodOwner:
    """A pod and what it claims: ``claims`` is ``({"job": id, "attempt": n},)`` for a job pod,
    one ``{"slice": id}`` per slice for a notebook pod, ``()`` for a pod gpushare does not
    own. ``rank`` is a job pod's node rank."""

    uid: str
    namespace: str
    name: str
    claims: tuple[dict, ...] = ()
    rank: int | None = None

    def describe(self) -> str:
        if not self.claims:
            return f"pod {self.namespace}/{self.name} (not gpushare's)"
        if "job" in self.claims[0]:
            c = self.claims[0]
            return f"job {c['job']} attempt {c['attempt']} rank {self.rank} ({self.name})"
        return f"slice {', '.join(c['slice'] for c in self.claims)} ({self.name})"


def owner(pod: Mapping) -> PodOwner | None:
    """The pod's owner; None for an object without a UID."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if not uid:
        return None
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    base = dict(uid=uid.lower(), namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or ""))
    if labels.get(MANAGED_BY) == MANAGER and labels.get(COMPONENT) == "train-job":
        job, attempt = labels.get(JOB, ""), _whole(labels.get(ATTEMPT))
        if _ID.match(job) and attempt:
            return PodOwner(**base, claims=({"job": job, "attempt": attempt},),
                            rank=_whole(labels.get(RANK), least=0))
    slices = [s.strip() for s in str(annotations.get(SLICES) or "").split(",") if s.strip()]
    slices = [s for s in slices if _ID.match(s)][:MAX_SLICES]
    if slices:
        return PodOwner(**base, claims=tuple({"slice": s} for s in slices))
    return PodOwner(**base)


def owners(pods: Iterable[Mapping]) -> dict[str, PodOwner]:
    """``{pod UID: PodOwner}`` of a pod list's items."""
    return {o.uid: o for o in map(owner, pods) if o is not None}


def _whole(text, least: int = 1) -> int | None:
    try:
        value = int(str(text))
    except (TypeError, ValueError):
        return None
    return value if value >= least else None
