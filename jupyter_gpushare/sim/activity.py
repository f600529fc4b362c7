"""What GPUs do while they are held: train jobs' utilization levels and notebook sessions'
bursts, for the simulator (docs/explanation/before-and-after.md says what each rests on).

A train job runs at one utilization level (the share of time a kernel runs on its GPUs, as
NVML and DCGM say it), from the trace's ``util`` column or drawn from a published
distribution. A notebook session uses its slice in short bursts while its user tests code
and not at all while they write it.

The profiles are per-GPU utilization CDFs that the AcmeTrace artifact publishes
(InternLM/AcmeTrace, ``data/utilization/util_pkl/util_gpu_*.pkl``, drawn in its
``figure/cdf_job_duration_util.pdf`` (b); Hu et al., "Characterization of Large Language
Model Development in the Datacenter", NSDI '24), read here at every 5th percentile:

- ``philly``: Microsoft's Philly cluster, 2017 (DNN training of its time): median 48.4 %,
  32 % of samples at 0 %.
- ``llm``: Shanghai AI Lab's Seren cluster, 2023 (LLM development): median 99 %, 31.5 % of
  samples at 0 %.

The samples are per GPU over time, not per job: drawing one level per job from them is this
model's assumption (a job at 0 % stands for the idle share: jobs stuck loading data, waiting
on a debugger, or done but not exited).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass

from ..usage.meter import UsageSettings

IDLE_THRESHOLD = UsageSettings.idle_threshold / 100
"""Utilization below which held GPU time is idle-allocated: the pool's ``idle_threshold``
(``GPUUsage.idle_threshold``, 5 %)."""

IDLE_JOB_AFTER_S = UsageSettings.idle_job_after
"""Seconds a job's GPUs stay idle before the pool flags it idle (``GPUUsage.idle_job_after``)."""

PROFILES: dict[str, tuple[float, ...]] = {
    # Utilization (0..1) at the 0th, 5th, ..., 100th percentile of each CDF.
    "philly": (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.061, 0.220, 0.371, 0.484, 0.584, 0.693,
               0.793, 0.873, 0.920, 0.964, 0.983, 0.993, 1.0, 1.0),
    "llm": (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.826, 0.970, 0.980, 0.990, 0.990, 0.990,
            0.990, 0.990, 0.990, 1.0, 1.0, 1.0, 1.0, 1.0),
}
PROFILE_SOURCES = {
    "philly": "Philly's per-GPU utilization CDF (AcmeTrace util_gpu_philly.pkl; data of "
              "Jeon et al., ATC '19)",
    "llm": "Seren's per-GPU utilization CDF (AcmeTrace util_gpu_seren.pkl; Hu et al., NSDI '24)",
}


def draw_util(profile: str, rng: random.Random) -> float:
    """One job's utilization level (0..1), drawn from ``profile``'s CDF by inverse transform,
    linear between the tabulated percentiles."""
    table = PROFILES[profile]
    x = rng.random() * (len(table) - 1)
    i = int(x)
    if i >= len(table) - 1:
        return table[-1]
    return table[i] + (table[i + 1] - table[i]) * (x - i)


def profile_mean(profile: str) -> float:
    """The mean utilization of a profile (trapezoids between the percentiles)."""
    t = PROFILES[profile]
    return sum((a + b) / 2 for a, b in zip(t, t[1:])) / (len(t) - 1)


@dataclass(frozen=True)
class SessionActivity:
    """How a notebook session uses its GPU while its user is at it: bursts of ``burst_gpu``
    GPUs (a test run of the code being written), ``burst_s`` long on average, separated by
    ``write_s`` of writing on average (both exponential). Unattended, it does nothing."""

    burst_gpu: float = 0.2
    burst_s: float = 180.0
    write_s: float = 1020.0

    def bursts(self, start: float, end: float, rng: random.Random) -> list[tuple[float, float]]:
        """The bursts of one attended stretch [start, end): (from, to) pairs in time order."""
        out, t = [], start + rng.expovariate(1.0 / self.write_s)
        while t < end:
            stop = min(end, t + rng.expovariate(1.0 / self.burst_s))
            out.append((t, stop))
            t = stop + rng.expovariate(1.0 / self.write_s)
        return out


def last_burst_end(bursts: list[tuple[float, float]], ends: list[float], now: float
                   ) -> tuple[float | None, bool]:
    """The end of the last burst that began before ``now`` (None if none) and whether a
    burst runs at ``now``; ``ends`` is the bursts' ends, in order, for the search."""
    i = bisect_right(ends, now)
    if i < len(bursts) and bursts[i][0] <= now:
        return None, True
    return (bursts[i - 1][1] if i else None), False
