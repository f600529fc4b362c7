"""Benchmark: what reading GPUs costs the pool service.

8 GPUs x 64 processes each, read once a second for ``--seconds`` by the real loop of the
service (``UsageMeter.run_local``: NVML calls and /proc in a worker thread, attribution, sums,
minute rows written to a real SQLite store), through the NVML stand-in (no GPU here). On each
GPU a job and a slice hold half; half the processes are the job's (its process group), half
are children of the slice's notebook server. Their ``/proc/<pid>/stat`` files are written to a
temporary directory that the attribution reads instead of /proc (512 processes are not
started for a benchmark).

It prints the CPU time of the whole process per wall second (share of one core) for:
  empty     the same asyncio loop waking once a second and doing nothing (the baseline),
  sampling  the service's loop reading, attributing and summing,
and the part of the sampling spent inside the stand-in (Python here; a C library call on a
real driver), measured by timing its calls, so that what real NVML would leave is visible.

    .venv/bin/python benchmarks/usage_sampler_cost.py [--seconds 60] [--gpus 8] [--processes 64]
"""

import argparse
import asyncio
import tempfile
import time

from jupyter_gpushare.policy.model import GPU
from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.usage_rollups import UsageStore
from jupyter_gpushare.usage.attribution import Holding, Owner
from jupyter_gpushare.usage.meter import LocalContext, UsageMeter, UsageSettings
from jupyter_gpushare.usage.nvml_standin import NVMLStandIn
from jupyter_gpushare.usage.procs import LocalOwners
from jupyter_gpushare.usage.sampler import NVMLSampler

GiB = 2**30


class TimedStandIn(NVMLStandIn):
    """The stand-in, with the time spent in its functions added up."""

    spent = 0.0

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if name.startswith("nvml") and callable(value):
            def timed(*args, **kw):
                start = time.process_time()
                try:
                    return value(*args, **kw)
                finally:
                    TimedStandIn.spent += time.process_time() - start
            return timed
        return value


def stat_line(pid: int, ppid: int, pgrp: int, session: int) -> str:
    rest = " ".join(["0"] * 16) + " 12345 " + " ".join(["0"] * 30)  # field 22: starttime
    return f"{pid} (python3) S {ppid} {pgrp} {session} 0 -1 0 {rest}\n"


def world(gpus: int, processes: int, proc: str):
    import os
    uuids = [f"GPU-bench-{i}" for i in range(gpus)]
    script = {"live_only": False, "gpus": [{"uuid": u} for u in uuids], "processes": []}
    holdings, groups, servers = {}, {}, {}
    pid = 4_000_000  # above any real pid

    def write(pid, ppid, pgrp, session):
        os.makedirs(f"{proc}/{pid}", exist_ok=True)
        with open(f"{proc}/{pid}/stat", "w") as f:
            f.write(stat_line(pid, ppid, pgrp, session))

    for g, uuid in enumerate(uuids):
        job = Owner("job", f"j-{g}/1", "ann", "vision", f"j-{g}")
        sl = Owner("slice", f"s-{g}", "bob")
        holdings[uuid] = [Holding(job, GPU // 2), Holding(sl, GPU // 2)]
        shim, server = 3_000_000 + g, 3_500_000 + g
        groups[shim], servers[server] = job, sl
        write(shim, 1, shim, shim)
        write(server, 1, server, server)
        for k in range(processes):
            script["processes"].append({"pid": pid, "gpu": uuid, "sm": (k % 7) * 2,
                                        "memory": GiB // 8})
            if k % 2:
                write(pid, shim, shim, shim)  # in the job's session
            else:
                write(pid, server, pid, pid)  # a kernel: a session of its own, under the server
            pid += 1
    return script, LocalContext(holdings, groups, servers, {u: "train" for u in uuids})


async def loop_cost(seconds: float, body) -> float:
    """CPU seconds of the process per wall second while ``body`` runs for ``seconds``."""
    task = asyncio.ensure_future(body())
    await asyncio.sleep(0.5)  # warm up: first readings, imports
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    task.cancel()
    return cpu / wall


async def empty():
    while True:
        await asyncio.sleep(1.0)


async def main_async(args):
    with tempfile.TemporaryDirectory() as tmp:
        script, context = world(args.gpus, args.processes, f"{tmp}/proc")
        store = Store(f"sqlite:///{tmp}/pool.sqlite")
        meter = UsageMeter(UsageStore(store), UsageSettings(sample_interval=1.0))
        sampler = NVMLSampler("bench", TimedStandIn(script))
        owners = LocalOwners(proc=f"{tmp}/proc")

        async def sampling():
            await asyncio.gather(meter.run_local([sampler], lambda: context, owners),
                                 meter.run_writer())

        base = await loop_cost(args.seconds, empty)
        TimedStandIn.spent = 0.0
        ours = await loop_cost(args.seconds, sampling)
        standin = TimedStandIn.spent / (args.seconds + 0.5)
        readings = meter.version
        use = meter.gpus_now()[0][1]
        attributed = sum(h.processes for h in use.holders)
        assert attributed == args.processes, (attributed, use)  # every process found its owner
    print(f"{args.gpus} GPUs x {args.processes} processes, read every 1 s for {args.seconds:g} s "
          f"({readings} readings)")
    print(f"  empty loop (baseline)  {base * 100:7.3f} % of one core")
    print(f"  sampling               {ours * 100:7.3f} % of one core "
          f"({ours / base if base else float('inf'):.1f}x the empty loop)")
    print(f"  of which the stand-in  {standin * 100:7.3f} % (Python here, C on a real driver)")
    print(f"  sampling less stand-in {(ours - standin - base) * 100:7.3f} % of one core above "
          f"the empty loop")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
