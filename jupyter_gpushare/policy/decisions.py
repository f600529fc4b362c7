"""What a cycle decides: starts, preemptions and waits, and the result that carries them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping

from . import reasons as R


@dataclass(frozen=True, slots=True)
class Start:
    job: str
    placement: Mapping[str, int]


class PreemptKind(enum.StrEnum):
    """Which rule took a job's GPUs back (``Preempt.kind``). A ``str`` whose value is the word
    an event or a report writes, so that it compares equal to that word."""

    GUARANTEE = "guarantee"  # for a job within its project's quota, from over-quota projects
    FAIR = "fair"  # for a borrower within its deserved share, from projects above theirs
    PRIORITY = "priority"  # for a job of higher priority, from its own project
    MOVE = "move"  # a job within quota moved so that a gang within quota fits (moves.py)
    TAKE_BACK = "take back"  # lent build GPUs that the build pool takes back (lending.py)


@dataclass(frozen=True, slots=True)
class Preempt:
    job: str
    project: str
    for_job: str
    why: str
    kind: PreemptKind = PreemptKind.GUARANTEE

    def __post_init__(self):
        if type(self.kind) is not PreemptKind:  # its word, from a caller that has only that
            object.__setattr__(self, "kind", PreemptKind(self.kind))


@dataclass(frozen=True, slots=True)
class Wait:
    job: str
    position: int | None  # None: the job can never run as asked
    reason: R.Reason
    reserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class Left:
    """The free GPUs per train node, those still being released and promised to no claimant
    per node, and the milli-GPUs each project's claimants were promised, as a cycle left
    them (the ledger's ``free``, ``releasing`` and ``claimed``). Read only."""

    free: Mapping[str, int]
    releasing: Mapping[str, int]
    claimed: Mapping[str, int]


@dataclass(frozen=True)
class CycleResult:
    """The decisions of one cycle.

    ``starts``, ``preemptions``, ``reservation`` and ``unschedulable`` are what a caller acts
    on; ``waits`` (every pending job with its queue position and reason) is worked out the
    first time it is read, so a caller that does not show reasons does not pay for them.
    """

    starts: tuple[Start, ...]
    preemptions: tuple[Preempt, ...]
    deserved: Mapping[str, int]
    usage: Mapping[str, int]
    held: Mapping[str, int]
    """Free GPUs kept idle this cycle for a job whose reclaimed GPUs are on their way."""
    reservation: Wait | None
    unschedulable: tuple[Wait, ...]
    _explain: Callable[[], tuple[Wait, ...]] = field(repr=False, compare=False)
    within_quota_waiting: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """The jobs that keep their project within quota and did not start this cycle (claiming,
    or waiting for young victims or for room): the ones the guarantee's bound is about."""
    left: "Left | None" = field(default=None, repr=False, compare=False)
    """What the cycle left when it was done: for a caller that asks whether one more job
    could change anything (the simulator sparing a cycle, ``sim/engine.py``)."""

    @cached_property
    def waits(self) -> tuple[Wait, ...]:
        return self._explain()
