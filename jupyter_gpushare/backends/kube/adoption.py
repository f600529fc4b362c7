"""After a restart of the service: which gangs to take back, which attempts ended or are
lost, which pods to clean up. A pure plan over the handles and the listed pods; the backend
carries it out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..base import LOST, Exit, Handle
from . import objects as k8s
from .gang import Gang, layout_of


@dataclass
class Plan:
    exits: list[Exit] = field(default_factory=list)  # ended meanwhile, or lost
    gangs: list[Gang] = field(default_factory=list)  # watched again, every rank of them
    clean: list[tuple[tuple, str, int | None]] = field(default_factory=list)
    """Ended pods of attempts reported before the restart: (key, pod, node rank) whose log is
    kept, then deleted."""
    orphans: list[str] = field(default_factory=list)  # running pods of no job: deleted


def plan(handles: list[Handle], pods: Mapping[str, dict], recorded: Callable[[tuple], Exit | None],
         namespace: str, known: set, doomed: Mapping) -> Plan:
    """``pods``: the job pods listed now; ``recorded(key)``: an attempt's exit record;
    ``known``: attempts this backend already watches; ``doomed``: pods being deleted."""
    out, named = Plan(), set()
    for h in handles:
        key = (h.job_id, h.attempt)
        named.add(key)
        if key in known:
            continue
        try:
            ranks = layout_of(h.data.get("ranks") or h.data.get("pods"))
        except (TypeError, ValueError, KeyError):
            ranks = ()
        ended = recorded(key)
        if ended is not None:
            out.exits.append(ended)
        elif not ranks or h.data.get("namespace", namespace) != namespace:
            # e.g. the service died while starting it: any pods it made are deleted below
            named.discard(key)
            out.exits.append(Exit(*key, LOST, reason="its record does not name its pods"))
        elif not any(p.name in pods for p in ranks):
            out.exits.append(Exit(*key, LOST, reason="its pods are gone"))
        else:
            placement = {str(n): int(m) for n, m in dict(h.data.get("placement") or {}).items()}
            rendezvous = h.data.get("rendezvous")
            out.gangs.append(Gang(*key, ranks, placement, float("-inf"),
                                  str(rendezvous) if rendezvous else None,
                                  lent=_lent(h.data.get("lent"))
                                  or _lent_of_pods(ranks, placement, pods)))
    for name, pod in pods.items():
        labels = pod["metadata"].get("labels") or {}
        key = (labels.get(k8s.JOB), _int(labels.get(k8s.ATTEMPT)))
        if key in named or key in known or name in doomed:
            continue
        if k8s.pod_state(pod).phase in k8s.ENDED:
            if key[0] and key[1] is not None:
                out.clean.append((key, name, _int(labels.get(k8s.RANK))))
            else:
                out.clean.append((key, name, None))
        else:
            out.orphans.append(name)
    return out


def _lent(record) -> dict[str, tuple[int, ...]]:
    """The build GPUs lent to a gang, from its handle (none in an older or odd record)."""
    try:
        return {str(node): tuple(int(g) for g in gpus) for node, gpus in dict(record or {}).items()}
    except (TypeError, ValueError):
        return {}


def _lent_of_pods(ranks, placement: Mapping[str, int],
                  pods: Mapping[str, dict]) -> dict[str, tuple[int, ...]]:
    """The build GPUs lent to a gang, as its pods' annotations say (a record without them)."""
    out = {}
    for rank, node in zip(ranks, sorted(placement)):
        said = ((pods.get(rank.name) or {}).get("metadata", {}).get("annotations")
                or {}).get(k8s.LENT)
        if said:
            try:
                out[node] = tuple(int(g) for g in said.split(","))
            except ValueError:
                continue
    return out


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
