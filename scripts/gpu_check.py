"""Check, on a machine with an NVIDIA GPU, what the build slices rely on.

    python scripts/gpu_check.py [--gpu 0] [--fraction 0.25] [--inventory-only]

1. The NVML inventory as ``jupyter_gpushare.gpus`` reads it: every GPU with its UUID, name,
   memory, utilization, MIG mode and instances, and the GPU memory of each process; what NVML
   could not read is said in one sentence.
2. A ¼ slice as the local spawner's ``pinned`` mode makes it (``spawner/modes.py``): a child
   Python, started like a notebook kernel with the slice's environment (CUDA_VISIBLE_DEVICES
   naming the GPU by UUID, and the framework caps derived from the fraction) and the kernel
   start-up code that caps PyTorch when it is imported (``spawner/kernel.py``), then
   - allocates 80 % of the slice with PyTorch: must succeed;
   - holds 50 % of it: the slice watchdog (``notebook/watchdog.py``), sampling this script's
     process tree through NVML, must find it within the slice (the CUDA context counts too);
   - allocates 120 % of the slice: must fail (the per-process cap of PyTorch's allocator);
   - lifts its own cap (any kernel may: the caps are soft) and allocates 120 % again: this
     succeeds, and the watchdog must report the slice overrun.

3. Utilization as the pool measures it (``usage/``): the real sampler reads the GPU once a
   second while a "job" (a child Python in a session of its own, on the whole GPU) runs a
   matrix-multiply loop and a ¼ "slice" (a child of this script, standing for its notebook
   server) holds a CUDA context and does nothing; attributed and summed as the pool does,
   the job must be above 50 % utilized and the slice below 5 %. The numbers are printed.

Needs nvidia-ml-py (a dependency of the package) and, for steps 2 and 3, PyTorch with CUDA
(``pip install torch``; not a dependency of the package). Exit status 0 when every
expectation held, 1 when one did not, 2 when the check could not run. Inside a container,
NVML lists host PIDs that are not this container's, so the watchdog cannot attribute memory
there: the script says so instead of failing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

from jupyter_gpushare.gpus import InventoryError, NVMLInventory
from jupyter_gpushare.notebook.watchdog import BuildSlice, SliceWatchdog, gib

try:  # the spawners' slicing modes: the environment a pinned slice gets
    from jupyter_gpushare.spawner.modes import pinned
except ImportError:  # an older tree: CUDA_VISIBLE_DEVICES and PyTorch's cap only
    pinned = None

CHILD = textwrap.dedent("""
    import json, sys
    from jupyter_gpushare.spawner.kernel import start
    start()  # what a kernel of a gpushare spawner runs first (PYTHONSTARTUP)
    import torch

    def say(**fields):
        print(json.dumps(fields), flush=True)

    def allocate(step, n):
        try:
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
            t.fill_(1)
            torch.cuda.synchronize()
            say(step=step, ok=True, bytes=n, reserved=torch.cuda.memory_reserved())
            return t
        except torch.cuda.OutOfMemoryError as e:
            say(step=step, ok=False, bytes=n, error=str(e).splitlines()[0][:300])
            return None

    if not torch.cuda.is_available():
        say(step="device", ok=False, error="PyTorch sees no CUDA device")
        sys.exit(0)
    total = torch.cuda.get_device_properties(0).total_memory
    say(step="device", ok=True, name=torch.cuda.get_device_name(0), total=total,
        visible=torch.cuda.device_count(), torch=torch.__version__)
    limit = int(FRACTION * total)
    below = allocate("below", int(0.8 * limit))
    del below
    torch.cuda.empty_cache()
    # half the slice held (the CUDA context, outside the allocator, comes on top of it)
    held = allocate("held", int(0.5 * limit))
    sys.stdin.readline()            # the parent samples the watchdog now
    del held
    torch.cuda.empty_cache()
    refused = allocate("above", int(1.2 * limit))
    del refused
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)   # a kernel can lift its own cap
    held = allocate("uncapped", int(1.2 * limit))
    sys.stdin.readline()            # the parent samples the watchdog again
""")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to slice")
    parser.add_argument("--fraction", type=float, default=0.25, help="the slice (0 < f < 1)")
    parser.add_argument("--inventory-only", action="store_true", help="skip the slice check")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="how long the utilization check reads the GPU")
    args = parser.parse_args(argv)
    if not 0 < args.fraction < 1:
        parser.error(f"--fraction must be between 0 and 1, not {args.fraction}")

    inventory = NVMLInventory()
    try:
        samples = inventory.sample()
    except InventoryError as e:
        print(f"NVML: {e}")
        return 2
    print_inventory(samples)
    if args.inventory_only:
        return 0
    if not 0 <= args.gpu < len(samples):
        print(f"There is no GPU {args.gpu}: NVML lists {len(samples)}.")
        return 2
    gpu = samples[args.gpu].gpu
    if samples[args.gpu].mig_enabled:
        print(f"GPU {gpu.index} has MIG on: MIG slices are enforced by the hardware; run the "
              f"check on a GPU without MIG.")
        return 2
    status = check_slice(inventory, gpu, args.fraction)
    return max(status, check_utilization(gpu, args.seconds))


def print_inventory(samples) -> None:
    print(f"NVML lists {len(samples)} GPU(s):")
    for s in samples:
        d = s.device
        util = "n/a" if s.utilization is None else f"{s.utilization} %"
        mig = {None: "no MIG", True: "MIG on", False: "MIG off"}[s.mig_enabled]
        used = "?" if d.memory_used is None else gib(d.memory_used)
        print(f"  GPU {s.gpu.index} {s.gpu.uuid} {s.gpu.name}: {used} of "
              f"{gib(d.memory_total)} used, utilization {util}, {mig}")
        for device in s.devices():
            if device is not d:
                used = "?" if device.memory_used is None else gib(device.memory_used)
                print(f"    MIG {device.uuid} {device.name}: {used} of "
                      f"{gib(device.memory_total)} used")
            for p in device.processes or ():
                mem = "memory not reported" if p.used is None else gib(p.used)
                print(f"    pid {p.pid}: {mem}")
        for problem in s.problems:
            print(f"    (could not read) {problem}")


def check_slice(inventory, gpu, fraction: float) -> int:
    milli = round(fraction * 1000)
    if pinned is not None:
        slice_env = pinned(milli, [gpu.uuid]).env
        caps = "the spawner's pinned mode (spawner/modes.py)"
    else:
        slice_env = {"CUDA_VISIBLE_DEVICES": gpu.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                     "GPUSHARE_TORCH_MEMORY_FRACTION": f"{fraction:g}"}
        caps = "CUDA_VISIBLE_DEVICES and PyTorch's cap only (spawner/modes.py is missing)"
    print(f"\nA {fraction:g} slice of GPU {gpu.index} ({gib(gpu.memory_total)}): "
          f"{gib(int(fraction * gpu.memory_total))}, with the environment of {caps}:")
    for name, value in sorted(slice_env.items()):
        print(f"  {name}={value}")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.replace("FRACTION", repr(fraction))],
        env={**os.environ, **slice_env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    watchdog = SliceWatchdog(inventory, BuildSlice(fraction, gpu.uuid, "pinned"), os.getpid())
    failures = []

    def expect(what: str, held: bool) -> None:
        print(f"  {'ok  ' if held else 'FAIL'} {what}")
        if not held:
            failures.append(what)

    try:
        for line in child.stdout:
            if not line.startswith("{"):
                print(f"  child: {line.rstrip()}")
                continue
            step = json.loads(line)
            if step["step"] == "device":
                if not step["ok"]:
                    print(f"  PyTorch: {step['error']}; is the CUDA build of torch installed?")
                    return 2
                print(f"  PyTorch {step['torch']} sees {step['visible']} device(s): "
                      f"{step['name']}, {gib(step['total'])}")
                expect("CUDA sees only the slice's GPU", step["visible"] == 1)
                continue
            outcome = "allocated" if step["ok"] else f"refused: {step.get('error', '')}"
            print(f"  {step['step']}: {gib(step['bytes'])} {outcome}")
            if step["step"] == "below":
                expect("80 % of the slice is allocated", step["ok"])
            elif step["step"] == "held":
                expect("half the slice is held", step["ok"])
                report = watchdog.check()
                print(f"  watchdog: {report['message']}")
                if attributable(report):
                    expect("the watchdog finds the slice within its memory", not report["over"])
                child.stdin.write("\n")
                child.stdin.flush()
            elif step["step"] == "above":
                expect("120 % of the slice is refused by PyTorch's cap", not step["ok"])
            elif step["step"] == "uncapped":
                expect("with its cap lifted, the process gets 120 %", step["ok"])
                report = watchdog.check()
                print(f"  watchdog: {report['message']}")
                if attributable(report):
                    expect("the watchdog reports the slice overrun", report["over"])
                child.stdin.write("\n")
                child.stdin.flush()
    finally:
        child.stdin.close()
        child.wait(60)
    if child.returncode:
        print(f"  the child Python exited with status {child.returncode}")
        return 1
    print("\nEvery expectation held." if not failures else
          f"\n{len(failures)} expectation(s) failed: {'; '.join(failures)}.")
    return 1 if failures else 0


BUSY = textwrap.dedent("""
    import sys, time, torch
    a = torch.randn(4096, 4096, device="cuda")
    print("ready", flush=True)
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        b = a @ a
        torch.cuda.synchronize()
""")
IDLE = textwrap.dedent("""
    import sys, time, torch
    torch.zeros(1, device="cuda")  # a CUDA context, then nothing
    print("ready", flush=True)
    time.sleep(float(sys.argv[1]))
""")


def check_utilization(gpu, seconds: float) -> int:
    """Step 3: the pool's sampler and attribution on this GPU (see the module's docstring)."""
    import time

    from jupyter_gpushare.usage.attribution import Holding, Owner, attribute
    from jupyter_gpushare.usage.procs import LocalOwners
    from jupyter_gpushare.usage.rollup import RowKey, Totals, figures, reading_totals
    from jupyter_gpushare.usage.sampler import NVMLSampler

    print(f"\nUtilization of GPU {gpu.index} as the pool measures it ({seconds:g} s):")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu.uuid)
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(seconds + 10)], env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", IDLE, str(seconds + 10)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        for child in (busy, idle):
            if child.stdout.readline().strip() != "ready":
                print("  a child Python could not use the GPU through PyTorch (pip install "
                      "torch with CUDA)")
                return 2
        job = Owner("job", "check/1", "check", "check", "check")
        sl = Owner("slice", "check-slice", "check")
        holdings = {gpu.uuid: [Holding(job, 1000), Holding(sl, 250)]}  # (one GPU for both)
        sampler, owners = NVMLSampler("this machine"), LocalOwners()
        totals: dict = {}
        sampler.read()  # the first reading starts NVML's per-process sample window
        for _ in range(int(seconds)):
            time.sleep(1.0)
            reading = sampler.read()
            if reading.problem:
                print(f"  NVML: {reading.problem}")
                return 2
            pids = {p.pid for g in reading.gpus for p in g.all_processes()}
            found = owners.owners(pids, {busy.pid: job}, {os.getpid(): sl})
            for key, t in reading_totals(attribute(reading, holdings, found, {}), 1.0,
                                         5.0).items():
                totals.setdefault(key, Totals()).merge(t)
    finally:
        for child in (busy, idle):
            child.kill()
            child.wait()
    j = figures(totals.get(RowKey("job", "check/1", "", "check", "check", "check"), Totals()), 1)
    s = figures(totals.get(RowKey("slice", "check-slice", user="check"), Totals()), 1)
    print(f"  job (matrix multiply): utilization {j['utilization']}, slice (idle CUDA context): "
          f"utilization {s['utilization']}")
    failures = []
    if j["utilization"] is None or j["utilization"] <= 0.5:
        failures.append("the busy job was not measured above 50 %")
    if s["utilization"] is None or s["utilization"] >= 0.05:
        failures.append("the idle slice was not measured below 5 %")
    print("  as expected" if not failures else "  " + "; ".join(failures))
    return 1 if failures else 0


def attributable(report) -> bool:
    if report["problem"]:
        return False
    if report["unattributed"] and not report["processes"]:
        print("  (NVML's PIDs are not this machine's: a container; the watchdog cannot "
              "attribute memory here, so its expectations are skipped)")
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
