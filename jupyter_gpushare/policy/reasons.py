"""Why a job waits, said in words. Reasons are small values; the words are made on demand."""

from __future__ import annotations

from dataclasses import dataclass

from .model import gpus_text


def _where(gpus: int, nodes: int) -> str:
    return f"{gpus_text(gpus)} on one node" if nodes == 1 else f"{gpus_text(gpus)} on {nodes} nodes"


@dataclass(frozen=True, slots=True)
class Reason:
    def __str__(self) -> str:  # pragma: no cover - every subclass says its own
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class TooLarge(Reason):
    gpus: int
    capacity: int
    project: str = ""  # set when the project's limit, not the pool, is the bound
    nodes: int = 0  # set when the gang's fewest nodes, not the pool, are the bound
    department: str = ""  # set (with project) when the department's limit is the bound

    def __str__(self):
        if self.department:
            bound = (f"department {self.department} (of project {self.project}) may never use "
                     f"more than {gpus_text(self.capacity)}")
        elif self.project:
            bound = f"project {self.project} may never use more than {gpus_text(self.capacity)}"
        elif self.nodes:
            bound = (f"it must run on {self.nodes} nodes and the largest {self.nodes} nodes of "
                     f"the train pool have only {gpus_text(self.capacity)}")
        else:
            bound = f"the train pool has only {gpus_text(self.capacity)}"
        return f"the job asks for {gpus_text(self.gpus)} but {bound}; ask for fewer GPUs"


@dataclass(frozen=True, slots=True)
class AtLimit(Reason):
    project: str
    limit: int
    usage: int
    department: str = ""  # set when the project's department is at its limit

    def __str__(self):
        if self.department:
            return (f"department {self.department} (of project {self.project}) is at its limit "
                    f"of {gpus_text(self.limit)} ({gpus_text(self.usage)} in use by its projects)")
        return (f"project {self.project} is at its limit of {gpus_text(self.limit)} "
                f"({gpus_text(self.usage)} in use)")


@dataclass(frozen=True, slots=True)
class NoIdleGpus(Reason):
    """Borrowing: the project is beyond its quota and no idle GPUs fit the gang."""

    project: str
    quota: int
    usage: int
    gpus: int
    nodes: int

    def __str__(self):
        return (f"waiting for {_where(self.gpus, self.nodes)} to borrow: this would take project "
                f"{self.project} ({gpus_text(self.usage)} in use) beyond its quota of "
                f"{gpus_text(self.quota)}, and no idle GPUs fit")


@dataclass(frozen=True, slots=True)
class Fragmented(Reason):
    """Within quota, but the free GPUs are spread and nothing can be reclaimed."""

    gpus: int
    nodes: int
    free: int

    def __str__(self):
        free = gpus_text(self.free)
        verb = "are" if free.endswith("GPUs") else "is"
        return (f"waiting for {_where(self.gpus, self.nodes)}; {free} {verb} "
                f"free but not on few enough nodes, and no over-quota jobs can be reclaimed")


@dataclass(frozen=True, slots=True)
class Reclaiming(Reason):
    gpus: int
    nodes: int
    reclaimed: tuple[tuple[str, int], ...]  # (project, milli) being taken back

    def __str__(self):
        parts = ", ".join(f"{gpus_text(m)} from project {p}" for p, m in self.reclaimed)
        return f"waiting for {_where(self.gpus, self.nodes)}; reclaiming {parts}"


@dataclass(frozen=True, slots=True)
class Moving(Reason):
    """Within quota, blocked by the nodes' shape: jobs within their projects' quotas move
    off the nodes it needs (moves.py), perhaps with borrowers taken back too."""

    gpus: int
    nodes: int
    moved: tuple[tuple[str, int], ...]  # (project, milli) moving to other GPUs
    reclaimed: tuple[tuple[str, int], ...]  # (project, milli) being taken back

    def __str__(self):
        parts = ", ".join(f"{gpus_text(m)} of project {p}" for p, m in self.moved)
        taken = ", ".join(f"{gpus_text(m)} from project {p}" for p, m in self.reclaimed)
        return (f"waiting for {_where(self.gpus, self.nodes)}; moving {parts} to other GPUs"
                + (f" and reclaiming {taken}" if taken else ""))


@dataclass(frozen=True, slots=True)
class Releasing(Reason):
    gpus: int
    nodes: int

    def __str__(self):
        return (f"waiting for {_where(self.gpus, self.nodes)}; preempted jobs are releasing "
                f"them within their grace period")


@dataclass(frozen=True, slots=True)
class BehindClaim(Reason):
    """A borrower of a project whose job within quota is taking GPUs back: the project
    borrows nothing meanwhile, or its later jobs would push the claimant beyond the quota."""

    gpus: int
    nodes: int
    project: str
    claimant: str
    claim: int

    def __str__(self):
        return (f"waiting for {_where(self.gpus, self.nodes)}; project {self.project}'s job "
                f"{self.claimant} is taking back {gpus_text(self.claim)} for its quota, and the "
                f"project borrows no more until it starts")


@dataclass(frozen=True, slots=True)
class MinRuntime(Reason):
    gpus: int
    nodes: int
    min_runtime_s: float

    def __str__(self):
        return (f"waiting for {_where(self.gpus, self.nodes)}; the over-quota jobs that could "
                f"give them back have run less than the minimum of {self.min_runtime_s:g} s")


@dataclass(frozen=True, slots=True)
class Reserved(Reason):
    """This job holds a reservation; the nodes drain for it."""

    gpus: int
    nodes: tuple[str, ...]

    def __str__(self):
        return (f"waiting for {gpus_text(self.gpus)}; node(s) {', '.join(self.nodes)} are "
                f"reserved for this job and start no new borrowing jobs until it runs")


@dataclass(frozen=True, slots=True)
class BehindReservation(Reason):
    gpus: int
    nodes: int
    holder: str

    def __str__(self):
        return (f"waiting for {_where(self.gpus, self.nodes)}; the free GPUs are reserved for "
                f"job {self.holder}, which has waited longest")


def drained_note(nodes: list[str], idle: int) -> str:
    """Said after a waiting job's reason while drained nodes have idle GPUs."""
    return (f"; {gpus_text(idle)} on drained node{'s' if len(nodes) > 1 else ''} "
            f"{', '.join(nodes)} take no new jobs until an admin undrains "
            f"{'them' if len(nodes) > 1 else 'it'}")
