"""How an attempt that was told to stop ended: the one rule the service and the simulator share.

A preempted attempt gets SIGTERM, then SIGKILL after its grace period. During that grace it
may end in three ways, told apart by its exit status alone (contract point 9,
docs/explanation/scheduling.md#contract-9):

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
"""

from __future__ import annotations

import signal

from ..trainjob import FAILED, PREEMPTED, SUCCEEDED

STOP_EXIT_CODES = frozenset({128 + signal.SIGTERM, 128 + signal.SIGKILL})
"""Exit statuses that mean "stopped because it was told to": 143 and 137."""


def after_stop(exit_code: int | None) -> str:
    """The outcome of an attempt that ended while being preempted: ``succeeded`` or
    ``failed`` (it ended by itself, by its exit code; the job ends) or ``preempted`` (our
    stop ended it; the job is requeued). ``None``: no exit status was recorded."""
    if exit_code == 0:
        return SUCCEEDED
    if exit_code is None or exit_code in STOP_EXIT_CODES:
        return PREEMPTED
    return FAILED
