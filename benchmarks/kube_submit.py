"""Benchmark: 500 train jobs on 64 GPUs through the pool service's scheduling loop, on the
Kubernetes backend (the real control plane of tests/kube: etcd, kube-apiserver, scheduler,
controller-manager; 8 simulated nodes x 8 GPUs) beside the local backend (8 simulated nodes x 8
GPUs, jobs as processes) in the same run.

Both runs are the same: a store in a temporary directory, ``pool.loop.Scheduler`` with the
default policy, two projects with 32 GPUs of quota each, all 500 jobs submitted at once (1, 2,
4 or 8 GPUs; a fixed random mix), each running ``--seconds``. On Kubernetes the pods are
simulated containers that end after that time (annotation ``sim.gpushare.jupyter.org/run-seconds``);
locally the jobs run ``sleep``. Measured per job: submit -> Running (queueing included) and
start decision -> Running (the backend's own latency: pod created, bound by the real scheduler,
started and reported by the kubelet, seen by a watch; a local job's process spawned), counted
from the scheduling cycle that decided the start, so the starts of one cycle queue behind each
other; and jobs started per second.

    .venv/bin/python benchmarks/kube_submit.py [--jobs 500] [--seconds 2]

Needs the control plane's binaries (built and cached by the kube tests, ~5 min the first time).
"""

import argparse
import asyncio
import os
import pwd
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kube.harness import KubeCluster  # noqa: E402
from kube.rest import KubeError  # noqa: E402

from jupyter_gpushare import gpus as gpu_inventory  # noqa: E402
from jupyter_gpushare.backends.base import Launch  # noqa: E402
from jupyter_gpushare.backends.kube import KubernetesBackend  # noqa: E402
from jupyter_gpushare.backends.local import LocalBackend  # noqa: E402
from jupyter_gpushare.policy import PolicyConfig  # noqa: E402
from jupyter_gpushare.policy.model import GPU  # noqa: E402
from jupyter_gpushare.pool.loop import Scheduler  # noqa: E402
from jupyter_gpushare.pool.models import ProjectRow  # noqa: E402
from jupyter_gpushare.pool.store import Store  # noqa: E402
from jupyter_gpushare.sim.metrics import percentile  # noqa: E402

NODES, GPUS_PER_NODE = 8, 8
MIX = [(1, 0.70), (2, 0.20), (4, 0.08), (8, 0.02)]
JOB_LABEL = "gpushare.jupyter.org/job"


class SimulatedLocal(LocalBackend):
    """Simulated nodes even where NVML finds GPUs: both runs see the same pool."""

    def detect_inventories(self):
        return [gpu_inventory.SimulatedInventory(f"local-{i}", GPUS_PER_NODE)
                for i in range(NODES)]


def job_sizes(n: int) -> list[int]:
    rng = random.Random(6)
    return rng.choices([g for g, _ in MIX], [w for _, w in MIX], k=n)


class PodWatch:
    """When each job's pods were first all Running, from a watch of our own (admin token)."""

    def __init__(self, cluster, namespace):
        self.cluster, self.namespace = cluster, namespace
        self.running: dict[str, float] = {}
        self._ranks: dict[str, set] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        api, path = self.cluster.api, f"/api/v1/namespaces/{self.namespace}/pods"
        rv = api.get(path)["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            try:
                for event in api.watch(path, rv, timeout_seconds=30):
                    pod = event["object"]
                    rv = pod["metadata"].get("resourceVersion", rv)
                    labels = pod["metadata"].get("labels") or {}
                    job = labels.get(JOB_LABEL)
                    if job and pod.get("status", {}).get("phase") == "Running":
                        self._ranks.setdefault(job, set()).add(pod["metadata"]["name"])
                        ranks = int(next(e["value"] for e in pod["spec"]["containers"][0]["env"]
                                         if e["name"] == "GPUSHARE_NUM_NODES"))
                        if len(self._ranks[job]) == ranks:
                            self.running.setdefault(job, time.time())
            except KubeError:
                rv = api.get(path)["metadata"]["resourceVersion"]
            except Exception:  # the cluster is going away
                if self._stop.is_set():
                    return
                raise

    def stop(self):
        self._stop.set()


async def run(backend, sizes, seconds, running_times, label):
    """Submit every job at once, run the loop until all have ended; per-job timings."""
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        store = Store(f"sqlite:///{tmp}/pool.sqlite")
        now = time.time()
        store.add_missing_projects([ProjectRow(name=p, quota=32 * GPU, groups=[p],
                                               over_quota_weight=1, priority=0, limit=None,
                                               updated=now) for p in ("vision", "nlp")])
        user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name

        checkpoints = Path(tmp) / "ckpt"
        checkpoints.mkdir(mode=0o1777)
        os.chmod(tmp, 0o755)
        os.chmod(checkpoints, 0o1777)  # a root service runs local jobs as nobody

        def launch_for(row):
            return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command), {},
                          dict(row.placement), str(checkpoints / row.id), "/tmp")

        scheduler = Scheduler(store, backend, PolicyConfig(), 5.0, launch_for)
        t0 = time.time()
        ids = [store.add_job(time.time(), user=user, project=("vision", "nlp")[i % 2],
                             name=f"bench-{i}", gpus=g * GPU, priority=0,
                             command=["sleep", str(seconds)], env={}, workdir="/tmp",
                             checkpoint_dir="").id for i, g in enumerate(sizes)]
        submitted = time.time() - t0
        loop = asyncio.create_task(scheduler.run(1.0))
        scheduler.wake()
        while len(store.active()):
            await asyncio.sleep(0.2)
        span = time.time() - t0
        loop.cancel()
        rows = [store.job(i) for i in ids]
        failed = [r for r in rows if r.state != "succeeded"]
        if failed:
            print(f"  {label}: {len(failed)} jobs did not succeed, e.g. {failed[0].message}")
        started = {r.id: r.started for r in rows}
        running = running_times(rows)
        to_running = [running[r.id] - r.submitted for r in rows if r.id in running]
        decision = [running[r.id] - started[r.id] for r in rows if r.id in running]
        first = sorted(running.values())
        fill = first[min(len(first), NODES * GPUS_PER_NODE // 2) - 1] - first[0]
        await backend.shutdown()
        return {
            "label": label, "jobs": len(rows), "submit_s": submitted, "span_s": span,
            "p50": percentile(to_running, 50), "p99": percentile(to_running, 99),
            "d50": percentile(decision, 50), "d99": percentile(decision, 99),
            "per_s": len(first) / (first[-1] - first[0]) if len(first) > 1 else 0.0,
            "fill_per_s": (min(len(first), 32) - 1) / fill if fill > 0 else 0.0,
            "seen": len(running)}


def report(r):
    print(f"  {r['label']:<28} submit->Running p50 {r['p50']:6.2f} s  p99 {r['p99']:6.2f} s | "
          f"start->Running p50 {r['d50'] * 1000:7.1f} ms  p99 {r['d99'] * 1000:7.1f} ms | "
          f"{r['per_s']:5.1f} jobs started/s overall, {r['fill_per_s']:5.1f}/s filling the "
          f"empty pool | all done in {r['span_s']:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=2.0, help="run time of each job")
    args = parser.parse_args()
    sizes = job_sizes(args.jobs)
    print(f"{args.jobs} jobs ({', '.join(f'{sizes.count(g)} x {g} GPU' for g, _ in MIX)}), "
          f"{args.seconds:g} s each, on {NODES} nodes x {GPUS_PER_NODE} GPUs "
          f"(ideal span {sum(sizes) * args.seconds / (NODES * GPUS_PER_NODE):.1f} s)")
    results = []
    with tempfile.TemporaryDirectory(prefix="gpushare-kube-bench-") as tmp:
        t = time.monotonic()
        with KubeCluster(Path(tmp), workers=8, extra_args={
                "kube-scheduler": ["--kube-api-qps=500", "--kube-api-burst=1000"],
                "kube-controller-manager": ["--kube-api-qps=500", "--kube-api-burst=1000"]},
                ) as cluster:
            print(f"control plane up in {time.monotonic() - t:.1f} s")
            for i in range(NODES):
                cluster.kubelet.add_node(f"train-{i}", gpus=GPUS_PER_NODE,
                                         labels={"gpushare.jupyter.org/pool": "train"})
            namespace = cluster.namespace("bench")
            watch = PodWatch(cluster, namespace)
            backend = KubernetesBackend(
                kubeconfig=str(cluster.kubeconfig), namespace=namespace,
                state_dir=f"{tmp}/kube-state", grace_period=5, extra_annotations={
                    "sim.gpushare.jupyter.org/run-locally": "false",
                    "sim.gpushare.jupyter.org/run-seconds": str(args.seconds)})
            results.append(asyncio.run(run(backend, sizes, args.seconds,
                                           lambda rows: dict(watch.running),
                                           "Kubernetes backend")))
            watch.stop()
    local = SimulatedLocal(state_dir=tempfile.mkdtemp(prefix="gpushare-local-bench-"),
                           run_as_service_user=os.geteuid() != 0)
    # A local job runs once its process is spawned: its log file is created just before.
    results.append(asyncio.run(run(local, sizes, args.seconds,
                                   lambda rows: {r.id: os.stat(local.log_path(r.id, 1)).st_mtime
                                                 for r in rows},
                                   "local backend (processes)")))
    for r in results:
        report(r)


if __name__ == "__main__":
    main()
