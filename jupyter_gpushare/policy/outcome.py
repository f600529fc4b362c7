"""What a job does after one of its attempts ended: one rule, the service's and the simulator's.

An attempt ends by itself (its work is done, or it failed), vanishes without a trace, or ends
because it was told to stop. A preempted attempt gets SIGTERM, then SIGKILL after its grace
period. During that grace it may end in three ways, told apart by its exit status alone
(contract point 9, docs/explanation/scheduling.md#contract-9):

- **exit 0**: it finished its work by itself (often it was about to anyway). The job has
  succeeded; it is never requeued, since running it again would repeat work and side effects.
- **killed by our stop, or said so**: SIGTERM or SIGKILL killed it (exit status 128 + 15 =
  143, or 128 + 9 = 137, as shells and Kubernetes report it), a job that caught SIGTERM, wrote
  its checkpoint and exited 143 as the convention asks, or no status was recorded at all.
  That is the normal preemption: the job is requeued to resume from its checkpoint.
- **any other exit status**: it failed by itself (a crash, an error in its SIGTERM handler).
  The job has failed with that exit code; it is not requeued, as it would not be had it
  failed a moment before the stop.

So a job that stops early on SIGTERM must not exit 0: exit 0 says the work is done.

``after_attempt`` is the whole rule, cancels and vanished attempts included: the service's
loop applies it to each exit its backend reports, the simulator to each attempt whose work
ends or whose grace runs out (``sim/engine.py``), so that what the simulator reports is what
the pool would do.
"""

from __future__ import annotations

import signal

from ..trainjob import CANCELLED, FAILED, PENDING, PREEMPTED, SUCCEEDED

STOP_EXIT_CODES = frozenset({128 + signal.SIGTERM, 128 + signal.SIGKILL})
"""Exit statuses that mean "stopped because it was told to": 143 and 137."""

KILLED = 128 + signal.SIGKILL
"""The exit status of an attempt still running when its grace ran out: SIGKILL ended it."""

REQUEUED = frozenset({PREEMPTED, PENDING})
"""The outcomes after which the job waits in its queue again (``after_attempt``)."""


def after_stop(exit_code: int | None) -> str:
    """The outcome of an attempt that ended while being preempted: ``succeeded`` or
    ``failed`` (it ended by itself, by its exit code; the job ends) or ``preempted`` (our
    stop ended it; the job is requeued). ``None``: no exit status was recorded."""
    if exit_code == 0:
        return SUCCEEDED
    if exit_code is None or exit_code in STOP_EXIT_CODES:
        return PREEMPTED
    return FAILED


def after_attempt(ended: str, exit_code: int | None, *, vanished: bool = False,
                  stopping: bool = False, cancelling: bool = False) -> str:
    """What the job does now that an attempt ended; one of

    - ``cancelled``, ``succeeded`` or ``failed``: the job ends in that state;
    - ``preempted``: our stop ended the attempt; the job is requeued to resume from its
      checkpoint;
    - ``pending``: the attempt vanished without an exit status while nothing stopped it; the
      job is requeued to run again.

    ``ended`` is the attempt's end as its backend read it (``succeeded`` for exit 0, else
    ``failed``), taken as it is when nothing stopped the attempt; ``vanished``: the backend
    lost it without a status; ``stopping``: it was being preempted; ``cancelling``: its user
    or an admin cancelled it, which ends the job however the attempt ended."""
    if cancelling:
        return CANCELLED
    if stopping:
        return PREEMPTED if vanished else after_stop(exit_code)
    if vanished:
        return PENDING
    return ended
