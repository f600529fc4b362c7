"""Benchmark: from executing a ``%%train`` cell to its first output line in the notebook.

A real JupyterHub, proxy and pool service (local backend, default ``cycle_interval``), and a
real kernel with a user's token, as in a single-user server. Each cell is
``%%train`` / ``print("hi")``; the time runs from sending the execute request to the first
``stream`` message on iopub. Baseline in the same run and kernel: ``!python -c 'print("hi")'``
(a subprocess of the same Python, without the pool).

    .venv/bin/python benchmarks/train_cell_latency.py [--cells 20] [--cycle-interval S]

The cell ends when the pool has recorded the job's end, which it notices on its next
scheduling cycle: ``--cycle-interval`` shows how much of the cell's length that is.

Needs the proxy (the README's test command).
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hubtest import Hub  # noqa: E402
from kernels import Kernel  # noqa: E402

from jupyter_gpushare.sim.metrics import percentile  # noqa: E402

POOL = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / "tests")!r})
c = get_config()
c.PoolService.backend_class = "kernels.ServiceUserBackend"
c.LocalBackend.run_as_service_user = True
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.PoolService.projects = {{"vision": {{"quota": 4, "groups": ["vision"]}}}}
"""


def first_output(kernel, code: str) -> tuple[float, float]:
    """Seconds to the first output line, and to the cell's end (the kernel idle again)."""
    start = time.monotonic()
    cell = kernel.collect(kernel.send(code), timeout=60)
    assert cell.status == "ok" and "hi" in cell.stdout, cell.text
    return cell.first_output_at - start, time.monotonic() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--cycle-interval", type=float, default=None, metavar="S",
                        help="PoolService.cycle_interval (default: the service's default)")
    args = parser.parse_args(argv)
    pool = POOL + ("" if args.cycle_interval is None else
                   f"c.PoolService.cycle_interval = {args.cycle_interval!r}\n")
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(Path(tmp), {"vision": ["alice"]}, pool).start()
        kernel = None
        try:
            notebook = Path(tmp) / "notebook"
            notebook.mkdir()
            kernel = Kernel(str(notebook), {"JUPYTERHUB_API_TOKEN": hub.token("alice"),
                                            "GPUSHARE_URL": hub.pool_url})
            assert kernel.run("%load_ext jupyter_gpushare").status == "ok"
            first_output(kernel, '%%train\nprint("hi")')  # warm: imports, the hub's token cache
            train, plain = [], []
            for _ in range(args.cells):  # interleaved, so both see the same machine load
                train.append(first_output(kernel, '%%train\nprint("hi")'))
                plain.append(first_output(kernel, 'import sys\n!{sys.executable} -c "print(\'hi\')"'))
        finally:
            if kernel is not None:
                kernel.stop()
            hub.stop()
    print(f"{args.cells} cells each, seconds from executing the cell to")
    for which, name in ((0, "its first output line"), (1, "its end (the cell done)")):
        print(f"  {name}:")
        t = [v[which] for v in train]
        p = [v[which] for v in plain]
        for label, values in (("%%train cell", t), ("!python subprocess (baseline)", p)):
            print(f"    {label:31s} p50 {percentile(values, 50):.3f}  p99 "
                  f"{percentile(values, 99):.3f}")
        print(f"    {'ratio of the p50s':31s} {percentile(t, 50) / percentile(p, 50):.1f}x")


if __name__ == "__main__":
    main()
