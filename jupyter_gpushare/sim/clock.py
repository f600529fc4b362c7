"""The simulation's clock: the events still to come, in time order, and when the next
cycle runs. Time only moves through this queue.

Events at one instant are handled in the order of their kinds: GPUs come free (FINISH,
RELEASE) before new work arrives (SUBMIT), a caller's scheduled change (CALL,
``Simulator.at``) comes next, and the cycle (CYCLE) sees them all.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

FINISH, RELEASE, SUBMIT, CALL, CYCLE = range(5)


class EventClock:
    """The event queue. A cycle is asked for with ``cycle_after``; the clock keeps at most
    one queued per instant, and runs it no sooner than ``cycle_interval_s`` after the last
    one, ``cycle_delay_s`` after the change that asked for it."""

    def __init__(self, cycle_interval_s: float = 0.0, cycle_delay_s: float = 0.0):
        self.interval_s = cycle_interval_s
        self.delay_s = cycle_delay_s
        self.heap: list[tuple] = []  # (t, kind, seq, job, attempt)
        self.seq = 0  # ties at one instant and kind go first come, first served
        self.calls: dict[int, Callable[[float], None]] = {}  # seq → a caller's CALL
        self.cycles_at: set[float] = set()  # times of the cycles queued
        self.cycle_due: float | None = None  # the earliest one a change asked for
        self.last_cycle = -math.inf
        self.stop_at = math.inf  # a caller's end of the run (``Simulator.at`` users)

    def push(self, t: float, kind: int, job: str = "", attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, job, attempt))

    def call_at(self, t: float, call: Callable[[float], None]) -> None:
        self.push(t, CALL)
        self.calls[self.seq] = call

    def next(self) -> tuple | None:
        """The next event, (t, kind, seq, job, attempt), or None when none is left before
        ``stop_at``. A cycle taken off the queue is no longer queued at its time."""
        if not self.heap or self.heap[0][0] > self.stop_at:
            return None
        event = heapq.heappop(self.heap)
        if event[1] == CYCLE:
            self.cycles_at.discard(event[0])
        return event

    def take_call(self, seq: int) -> Callable[[float], None]:
        return self.calls.pop(seq)

    def cycle_after(self, t: float) -> None:
        """Something changed at ``t``: queue a cycle for it. A cycle due later (the wake-up
        of a young job's minimum runtime) must not hold this one up: the pool runs a cycle at
        once after a change, and so must the replay. The later cycle stays queued and runs at
        its time."""
        due = max(t + self.delay_s, self.last_cycle + self.interval_s)
        if self.cycle_due is None or due < self.cycle_due:
            self.cycle_due = due
            if due not in self.cycles_at:  # one cycle at a time is all a change needs
                self.cycles_at.add(due)
                self.push(due, CYCLE)

    def cycle_runs(self, t: float) -> None:
        """A cycle runs at ``t``: the next change asks for a new one."""
        self.cycle_due = None
        self.last_cycle = t
