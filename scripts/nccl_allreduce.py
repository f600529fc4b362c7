"""Check, on a machine with NVIDIA GPUs, that a distributed train job really trains: a
``torch.distributed`` NCCL all-reduce across the GPUs of this node, run as a job of the
pool's local backend (the backend the pool service runs on one machine), in both launch
modes:

    python scripts/nccl_allreduce.py [--gpus N] [--size-mib 256] [--iterations 20]

1. **per GPU** (``per_gpu``, ``%%train --per-gpu``): the backend starts one process per GPU,
   each with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT; each calls
   ``init_process_group("nccl")`` from that environment (``env://``), sets its device to
   LOCAL_RANK among the GPUs CUDA_VISIBLE_DEVICES names by UUID, and all-reduces.
2. **per node** (the default, torchrun-style): one process, which runs
   ``python -m torch.distributed.run the-same-program`` with no options at all: torchrun
   takes --nnodes, --node-rank, --nproc-per-node and the rendezvous from the PET_* variables
   the backend sets.

Every rank checks that the sum of ``rank + 1`` over the gang arrived, then times
``--iterations`` all-reduces of ``--size-mib`` MiB and reports the bus bandwidth (as
nccl-tests defines it: algorithm bandwidth × 2 (n - 1) / n). Prints one JSON object per mode
and exits 0 when every rank of both modes got the right sum, 1 when one did not, 2 when the
check could not run (no GPU, no PyTorch with CUDA: ``pip install torch``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import textwrap
import time

from jupyter_gpushare.backends import Launch
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.gpus import InventoryError, NVMLInventory
from jupyter_gpushare.policy.model import GPU

RANK_PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    size_mib, iterations = int(sys.argv[1]), int(sys.argv[2])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(x == expected))
    big = torch.ones(size_mib * 2**20 // 4, device="cuda")
    for _ in range(3):  # warm up
        dist.all_reduce(big)
    torch.cuda.synchronize()
    dist.barrier()
    began = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - began) / iterations
    algbw = big.numel() * 4 / seconds / 1e9
    print("NCCL-REPORT " + json.dumps({
        "rank": rank, "world_size": world, "local_rank": local, "sum_ok": ok,
        "sum": x[0].item(), "expected": expected, "device": torch.cuda.get_device_name(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "size_mib": size_mib, "seconds_per_all_reduce": seconds,
        "algbw_gb_s": algbw, "busbw_gb_s": algbw * 2 * (world - 1) / world}), flush=True)
    dist.destroy_process_group()
""")


class ThisMachine(LocalBackend):
    """The local backend on the GPUs NVML finds here, running jobs as this script's user
    (a root pool service would run them as their submitting users)."""

    def detect_inventories(self):
        return [NVMLInventory()]

    def _service_is_root(self):
        return False


async def check(backend, gpus: int, program: str, args, workdir: str) -> list[dict]:
    node = backend.nodes()[0].name
    results = []
    for per_gpu in (True, False):
        try:
            results.append(await run_mode(backend, node, gpus, per_gpu, program, args, workdir))
        except TimeoutError as e:
            results.append({"mode": "per GPU" if per_gpu else "per node", "error": str(e)})
    return results


async def run_mode(backend, node: str, gpus: int, per_gpu: bool, program: str, args,
                   workdir: str) -> dict:
    job = f"nccl-{'gpu' if per_gpu else 'node'}-{int(time.time())}"
    command = [sys.executable, program, str(args.size_mib), str(args.iterations)]
    if not per_gpu:  # torchrun, with every option from the PET_* variables
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    launch = Launch(job, 1, os.environ.get("USER", "gpushare"), "check", tuple(command), {},
                    {node: gpus * GPU}, os.path.join(workdir, job), workdir, per_gpu=per_gpu)
    await backend.start(launch)
    deadline = time.monotonic() + args.timeout
    exits = []
    while not exits:
        if time.monotonic() > deadline:
            await backend.stop(job, 1, 5)
            raise TimeoutError(f"the {job} job did not end within {args.timeout} s")
        exits = await backend.poll()
        await asyncio.sleep(0.2)
    ranks = gpus if per_gpu else 1
    logs = [(await backend.read_log(job, 1, rank=r)).decode(errors="replace")
            for r in range(ranks)]
    reports = [json.loads(line.split(" ", 1)[1]) for log in logs for line in log.splitlines()
               if line.startswith("NCCL-REPORT ")]
    return {"mode": "per GPU" if per_gpu else "per node (torchrun)", "job": job,
            "state": exits[0].state, "exit_code": exits[0].exit_code, "reason": exits[0].reason,
            "reports": sorted(reports, key=lambda r: r["rank"]),
            "log_tail": "" if exits[0].state == "succeeded" else logs[0][-3000:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, help="GPUs of this node to use (default: all)")
    parser.add_argument("--size-mib", type=int, default=256, help="all-reduce size (MiB)")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mode")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401  only to say early that it is missing
    except ImportError:
        print("PyTorch is not installed here (pip install torch): the check cannot run",
              file=sys.stderr)
        return 2
    try:
        found = NVMLInventory().gpus()
    except InventoryError as e:
        print(f"No GPU to check: {e}", file=sys.stderr)
        return 2
    gpus = args.gpus or len(found)
    if not 1 <= gpus <= len(found):
        print(f"--gpus must be 1 to {len(found)}, the GPUs NVML finds here", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpushare-nccl-") as workdir:
        program = os.path.join(workdir, "rank.py")
        with open(program, "w") as f:
            f.write(RANK_PROGRAM)
        backend = ThisMachine(state_dir=os.path.join(workdir, "state"),
                              run_as_service_user=True, grace_period=10,
                              env_keep=["PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME", "LANG"])
        results = asyncio.run(check(backend, gpus, program, args, workdir))
    good = True
    for result in results:
        print(json.dumps(result, indent=2))
        reports = result.get("reports") or []
        good &= (result.get("state") == "succeeded" and len(reports) == gpus
                 and all(r["sum_ok"] for r in reports))
    print("all-reduce across", gpus, "GPU(s):", "OK in both modes" if good else "FAILED",
          file=sys.stderr)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
