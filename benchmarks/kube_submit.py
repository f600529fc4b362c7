"""Benchmark: train jobs through the pool service's scheduling loop on the Kubernetes backend
(the real control plane of tests/kube: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager; simulated nodes) beside the local backend (the same simulated nodes,
jobs as processes) in the same run.

Both runs are the same: a store in a temporary directory, ``pool.loop.Scheduler`` with the
default policy, two projects with half the GPUs of quota each, all jobs submitted at once
(``--gpus N`` GPUs each, or by default a fixed random mix of 1, 2, 4 and 8), each running
``--seconds``. On Kubernetes the pods are simulated containers that end after that time
(annotation ``sim.gpushare.jupyter.org/run-seconds``); locally the jobs run ``sleep``.
Measured per job: submit -> Running (queueing included) and start decision -> Running (the
backend's own latency: pod created, bound by the real scheduler, started and reported by the
kubelet, seen by a watch; a local job's process spawned), counted from the scheduling cycle
that decided the start, so the starts of one cycle queue behind each other; jobs started per
second; on Kubernetes where that time went (decision -> pod seen created -> bound -> Running,
from a watch in a process of its own), the CPU time each process used, and the API requests a
job: of all clients (the API server's metrics) and the pool service's own by kind, counted as it
sends them (those not answered 200/201 by their answer, or "cancelled").

    .venv/bin/python benchmarks/kube_submit.py [--jobs 500] [--seconds 2]      # 8 nodes x 8
    .venv/bin/python benchmarks/kube_submit.py --nodes 64 --jobs 2000 --seconds 1 --gpus 1

The kubelet simulator and the watch that times the pods run in processes of their own, so
that neither shares an interpreter lock with the pool service under test. Needs the control
plane's binaries (built and cached by the kube tests, ~5 min the first time).
"""

import argparse
import asyncio
import cProfile
import multiprocessing
import os
import pwd
import random
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kube.cluster import ControlPlane, ensure_binaries  # noqa: E402
from kube.kubeletproc import KubeletProcess  # noqa: E402
from kube.rest import KubeError, KubeREST  # noqa: E402

from jupyter_gpushare import gpus as gpu_inventory  # noqa: E402
from jupyter_gpushare.backends.base import Launch  # noqa: E402
from jupyter_gpushare.backends.kube import KubernetesBackend  # noqa: E402
from jupyter_gpushare.backends.local import LocalBackend  # noqa: E402
from jupyter_gpushare.policy import PolicyConfig  # noqa: E402
from jupyter_gpushare.policy.model import GPU  # noqa: E402
from jupyter_gpushare.pool.store.database import ACTIVE, Store  # noqa: E402
from jupyter_gpushare.pool.store.models import ProjectRow  # noqa: E402
from jupyter_gpushare.pool.train.scheduler import Scheduler  # noqa: E402
from jupyter_gpushare.sim.metrics import percentile  # noqa: E402

MIX = [(1, 0.70), (2, 0.20), (4, 0.08), (8, 0.02)]
JOB_LABEL = "gpushare.jupyter.org/job"
CLIENT_RATE = ["--kube-api-qps=1000", "--kube-api-burst=2000"]


class SimulatedLocal(LocalBackend):
    """Simulated nodes even where NVML finds GPUs: both runs see the same pool."""

    def __init__(self, nodes: int, gpus_per_node: int, **kwargs):
        super().__init__(**kwargs)
        self.shape = (nodes, gpus_per_node)

    def detect_inventories(self):
        nodes, per_node = self.shape
        return [gpu_inventory.SimulatedInventory(f"local-{i}", per_node) for i in range(nodes)]


def job_sizes(n: int, gpus: int) -> list[int]:
    if gpus:
        return [gpus] * n
    rng = random.Random(6)
    return rng.choices([g for g, _ in MIX], [w for _, w in MIX], k=n)


# -- the watch that times the pods, in a process of its own ---------------------------------

def _watch_pods(server: str, token: str, namespace: str, conn) -> None:
    """Per pod, when the watch first showed it created, bound to a node and Running; per job,
    when all its pods were Running. Sent back when the parent asks."""
    import threading
    api, path = KubeREST(server, token), f"/api/v1/namespaces/{namespace}/pods"
    seen: dict[str, dict] = {}                # pod -> {"created", "bound", "running"}
    jobs: dict[str, float] = {}
    ranks: dict[str, set] = {}
    stop = threading.Event()
    cpu0: list[float] = []

    def run():
        rv = api.get(path)["metadata"]["resourceVersion"]
        cpu0.append(time.process_time())
        conn.send("ready")
        while not stop.is_set():
            try:
                for event in api.watch(path, rv, timeout_seconds=30):
                    now = time.time()
                    pod = event["object"]
                    meta = pod["metadata"]
                    rv = meta.get("resourceVersion", rv)
                    job = (meta.get("labels") or {}).get(JOB_LABEL)
                    if not job or event["type"] == "BOOKMARK":
                        continue
                    times = seen.setdefault(meta["name"], {"created": now})
                    if pod["spec"].get("nodeName"):
                        times.setdefault("bound", now)
                    if pod.get("status", {}).get("phase") == "Running":
                        times.setdefault("running", now)
                        ranks.setdefault(job, set()).add(meta["name"])
                        world = int(next(e["value"] for e in pod["spec"]["containers"][0]["env"]
                                         if e["name"] == "GPUSHARE_NUM_NODES"))
                        if len(ranks[job]) == world:
                            jobs.setdefault(job, now)
            except KubeError:
                rv = api.get(path)["metadata"]["resourceVersion"]
            except Exception:
                if stop.is_set():
                    return
                time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()
    conn.recv()                               # "stop"
    stop.set()
    conn.send((seen, jobs, time.process_time() - cpu0[0]))


class PodWatch:
    def __init__(self, cluster: ControlPlane, namespace: str):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_watch_pods, daemon=True,
                                   args=(cluster.url, cluster.token, namespace, child))
        self.process.start()
        if not self._conn.poll(60):
            raise TimeoutError("the pod watch did not start")
        self._conn.recv()

    def results(self) -> tuple[dict, dict, float]:
        """Pods' times, jobs' times, and the CPU seconds the watch's process used."""
        self._conn.send("stop")
        seen, jobs, cpu = self._conn.recv()
        self.process.join(5)
        return seen, jobs, cpu


# -- what the API server was asked ---------------------------------------------------------

def api_requests(api: KubeREST) -> dict[tuple[str, str], float]:
    """apiserver_request_total by (verb, resource[/subresource]), from its metrics; those
    refused for the API server's own in-flight limits as (verb, "429")."""
    counts: dict[tuple[str, str], float] = {}
    for line in api.text("/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(part.split("=", 1) for part in
                      line[line.index("{") + 1:line.rindex("}")].split(","))
        labels = {k: v.strip('"') for k, v in labels.items()}
        resource = labels.get("resource", "") + (f"/{labels['subresource']}"
                                                 if labels.get("subresource") else "")
        key = (labels.get("verb", ""), resource if labels.get("code") != "429" else "429")
        counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return counts


class CountedKubernetesBackend(KubernetesBackend):
    """The backend as it is, counting the requests it sends (``counts``: (verb, resource) ->
    how many) once it is connected, as its two clients send them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.counts: dict[tuple[str, str], int] = {}

    async def _ready(self) -> None:
        await super()._ready()
        for api_client in {id(c): c for c in (self.api.client, self.api.stream_client)
                           if c is not None}.values():
            rest = api_client.rest_client
            if getattr(rest, "counted", False):
                continue
            rest.counted = True
            rest.request = self._counting(rest.request)

    def _counting(self, request):
        async def counted(method, url, query_params=None, **kwargs):
            verb, resource = request_kind(method, url, query_params)
            answer = "cancelled"
            try:
                response = await request(method, url, query_params=query_params, **kwargs)
                answer = response.status
                return response
            except Exception as e:
                answer = getattr(e, "status", None) or type(e).__name__
                raise
            finally:
                key = (verb, resource + ("" if answer in (200, 201) else f" ({answer})"))
                self.counts[key] = self.counts.get(key, 0) + 1
        return counted


def request_kind(method: str, url: str, query) -> tuple[str, str]:
    """(verb, resource[/subresource]) of a request, as the API server's metrics name them."""
    path = urlsplit(url).path.strip("/").split("/")
    parts = path[2:] if path[0] == "api" else path[3:]  # api/v1/..., apis/group/version/...
    if parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    resource, named = parts[0], len(parts) > 1
    sub = parts[2] if len(parts) > 2 else ""
    asked = {k: str(v).lower() for k, v in (query or [])}
    watching = asked.get("watch") == "true"
    verb = {"GET": "watch" if watching else ("get" if named else "list"),
            "POST": "create", "DELETE": "delete" if named else "deletecollection",
            "PUT": "update", "PATCH": "patch"}.get(method.upper(), method.lower())
    following = " (follow)" if asked.get("follow") == "true" else ""
    return verb, resource + (f"/{sub}" if sub else "") + following


# -- CPU time of each process ---------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / TICK, sum(values) / TICK


# -- one run ----------------------------------------------------------------------------------

async def run(backend, sizes, seconds, gpus_total, running_times, label, drained=None,
              rate=0.0):
    """Submit every job at once (or ``rate`` a second), run the loop until all have ended
    (and ``drained()``: the backend has cleaned up after them); per-job timings."""
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        store = Store(f"sqlite:///{tmp}/pool.sqlite")
        now = time.time()
        store.quotas.add_missing_projects([ProjectRow(name=p, quota=gpus_total // 2 * GPU,
                                                      groups=[p], over_quota_weight=1, priority=0,
                                                      limit=None, updated=now)
                                           for p in ("vision", "nlp")])
        user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name

        checkpoints = Path(tmp) / "ckpt"
        checkpoints.mkdir(mode=0o1777)
        os.chmod(tmp, 0o755)
        os.chmod(checkpoints, 0o1777)  # a root service runs local jobs as nobody

        def launch_for(row):
            return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command), {},
                          dict(row.placement), str(checkpoints / row.id), "/tmp")

        scheduler = Scheduler(store, backend, PolicyConfig(), 5.0, launch_for)
        ids: list[str] = []

        def submit(i, g):
            ids.append(store.jobs.add(time.time(), user=user, project=("vision", "nlp")[i % 2],
                                      name=f"bench-{i}", gpus=g * GPU, priority=0,
                                      command=["sleep", str(seconds)], env={}, workdir="/tmp",
                                      checkpoint_dir="").id)

        async def paced():
            """``rate`` jobs a second, in tenths of a second, as users would send them."""
            begun = time.monotonic()
            for i, g in enumerate(sizes):
                due = begun + i / rate
                if due > time.monotonic():
                    scheduler.wake()
                    await asyncio.sleep(due - time.monotonic())
                submit(i, g)
            scheduler.wake()

        t0 = time.time()
        cpu0 = cpu_seconds(os.getpid())
        busy0 = machine_busy()
        if rate:
            submitting = asyncio.create_task(paced())
        else:
            for i, g in enumerate(sizes):
                submit(i, g)
        submitted = time.time() - t0
        loop = asyncio.create_task(scheduler.run(1.0))
        scheduler.wake()
        if rate:
            await submitting
        while any(store.jobs.state_counts(user).get(state) for state in ACTIVE):
            await asyncio.sleep(0.2)  # counted in the database: no rows loaded here
        span = time.time() - t0
        while drained is not None and not drained():  # its cost counted too
            await asyncio.sleep(0.2)
        cpu = cpu_seconds(os.getpid()) - cpu0
        busy1 = machine_busy()
        loop.cancel()
        rows = [store.jobs.get(i) for i in ids]
        failed = [r for r in rows if r.state != "succeeded"]
        if failed:
            print(f"  {label}: {len(failed)} jobs did not succeed, e.g. {failed[0].message}")
        await backend.shutdown()
        running = running_times(rows)
        to_running = [running[r.id] - r.submitted for r in rows if r.id in running]
        decision = [running[r.id] - r.started for r in rows if r.id in running]
        first = sorted(running.values())
        fill = first[min(len(first), gpus_total // 2) - 1] - first[0]
        return {
            "label": label, "jobs": len(rows), "submit_s": submitted, "span_s": span,
            "p50": percentile(to_running, 50), "p99": percentile(to_running, 99),
            "d50": percentile(decision, 50), "d99": percentile(decision, 99),
            "per_s": len(first) / (first[-1] - first[0]) if len(first) > 1 else 0.0,
            "fill_per_s": (min(len(first), gpus_total // 2) - 1) / fill if fill > 0 else 0.0,
            "seen": len(running), "rows": rows, "cpu_s": cpu,
            "busy": (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9)}


def report(r):
    print(f"  {r['label']:<28} submit->Running p50 {r['p50']:6.2f} s  p99 {r['p99']:6.2f} s | "
          f"start->Running p50 {r['d50'] * 1000:7.1f} ms  p99 {r['d99'] * 1000:7.1f} ms | "
          f"{r['per_s']:5.1f} jobs started/s overall, {r['fill_per_s']:5.1f}/s filling the "
          f"empty pool | all done in {r['span_s']:.1f} s | pool service CPU "
          f"{r['cpu_s'] / r['jobs'] * 1000:.1f} ms/job, machine {r['busy'] * 100:.0f} % busy")


def stages(rows, pods: dict) -> None:
    """Where start decision -> Running went, per pod (rank 0's pod of each job)."""
    steps = {"decision -> pod created (pool loop, our POST)": [],
             "created -> bound (kube-scheduler)": [],
             "bound -> Running (kubelet simulator)": []}
    names = list(steps)
    for r in rows:
        pod = (r.handle or {}).get("pods", [None])[0]
        t = pods.get(pod)
        if not t or "running" not in t:
            continue
        steps[names[0]].append(t["created"] - r.started)
        steps[names[1]].append(t.get("bound", t["running"]) - t["created"])
        steps[names[2]].append(t["running"] - t.get("bound", t["running"]))
    print("  where start decision -> Running went (as a watch in its own process saw it):")
    for name, values in steps.items():
        if values:
            print(f"    {name:<48} p50 {percentile(values, 50) * 1000:7.1f} ms  "
                  f"p99 {percentile(values, 99) * 1000:7.1f} ms")
    created = sorted(t["created"] for t in pods.values())
    bound = sorted(t["bound"] for t in pods.values() if "bound" in t)
    running = sorted(t["running"] for t in pods.values() if "running" in t)
    for what, times in (("created", created), ("bound", bound), ("Running", running)):
        if len(times) > 1:
            print(f"    pods {what:<8} {len(times) / (times[-1] - times[0]):6.1f}/s "
                  f"({len(times)} in {times[-1] - times[0]:.1f} s)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=2.0, help="run time of each job")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=0,
                        help="GPUs of every job (default: a mix of 1, 2, 4 and 8)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="submit this many jobs a second (default: all at once)")
    parser.add_argument("--kubelet-workers", type=int, default=32,
                        help="threads of the kubelet simulator that sync pods")
    parser.add_argument("--no-local", action="store_true", help="skip the local baseline")
    parser.add_argument("--profile", metavar="FILE",
                        help="cProfile the pool service's Kubernetes run into FILE")
    args = parser.parse_args()
    sizes = job_sizes(args.jobs, args.gpus)
    total = args.nodes * args.gpus_per_node
    ideal_span = sum(sizes) * args.seconds / total
    mix = ", ".join(f"{sizes.count(g)} x {g} GPU" for g in sorted(set(sizes)))
    when = f"submitted at {args.rate:g}/s" if args.rate else "submitted at once"
    print(f"{args.jobs} jobs ({mix}, {when}), {args.seconds:g} s each, on {args.nodes} nodes x "
          f"{args.gpus_per_node} GPUs (ideal: span {ideal_span:.1f} s, "
          f"{args.jobs / ideal_span:.0f} jobs started/s); {os.cpu_count()} cores")
    results = []
    with tempfile.TemporaryDirectory(prefix="gpushare-kube-bench-") as tmp:
        t = time.monotonic()
        cp = ControlPlane(ensure_binaries(), Path(tmp) / "control-plane", extra_args={
            "kube-scheduler": CLIENT_RATE, "kube-controller-manager": CLIENT_RATE})
        with cp, KubeletProcess(cp.api, Path(tmp) / "kubelet", cert=cp.pki["kubelet.crt"],
                                key=cp.pki["kubelet.key"],
                                workers=args.kubelet_workers) as kubelet:
            for i in range(args.nodes):
                kubelet.add_node(f"train-{i}", gpus=args.gpus_per_node,
                                 labels={"gpushare.jupyter.org/pool": "train"})
            namespace = f"bench-{os.getpid()}"
            cp.create_namespace(namespace)
            print(f"control plane up in {time.monotonic() - t:.1f} s")
            watch = PodWatch(cp, namespace)
            pids = {name: c.proc.pid for name, c in cp.components.items()}
            pids["kubelet simulator"] = kubelet.pid
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            asked0 = api_requests(cp.api)
            busy0 = machine_busy()
            backend = CountedKubernetesBackend(
                kubeconfig=str(cp.kubeconfig), namespace=namespace,
                state_dir=f"{tmp}/kube-state", grace_period=5, extra_annotations={
                    "sim.gpushare.jupyter.org/run-locally": "false",
                    "sim.gpushare.jupyter.org/run-seconds": str(args.seconds)})
            pods: dict = {}
            watch_cpu: list[float] = []

            def kube_running(rows):
                seen, jobs, cpu = watch.results()
                pods.update(seen)
                watch_cpu.append(cpu)
                return jobs

            profile = cProfile.Profile() if args.profile else None
            if profile:
                profile.enable()
            def no_pods():
                return not cp.api.get(f"/api/v1/namespaces/{namespace}/pods",
                                      limit=1)["items"]

            kube = asyncio.run(run(backend, sizes, args.seconds, total, kube_running,
                                   "Kubernetes backend", no_pods, args.rate))
            if profile:
                profile.disable()
                profile.dump_stats(args.profile)
            busy1 = machine_busy()
            asked1 = api_requests(cp.api)
            cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            cpu["pool service (submits included)"] = kube["cpu_s"]
            cpu["pod watch (benchmark)"] = watch_cpu[0]
            results.append(kube)
    if not args.no_local:
        local = SimulatedLocal(args.nodes, args.gpus_per_node,
                               state_dir=tempfile.mkdtemp(prefix="gpushare-local-bench-"),
                               run_as_service_user=os.geteuid() != 0)
        # A local job runs once its process is spawned: its log file is created just before.
        results.append(asyncio.run(run(
            local, sizes, args.seconds, total,
            lambda rows: {r.id: os.stat(local.log_path(r.id, 1)).st_mtime for r in rows},
            "local backend (processes)", rate=args.rate)))
    for r in results:
        report(r)
    stages(kube["rows"], pods)
    span = kube["span_s"]
    busy = busy1[0] - busy0[0]
    print(f"  CPU during the Kubernetes run ({span:.1f} s; the machine was busy "
          f"{busy:.1f} of {busy1[1] - busy0[1]:.1f} core-seconds, other work included):")
    for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<30} {seconds:6.1f} s  ({seconds / span * 100:5.1f} % of one core)")
    asked = {k: v - asked0.get(k, 0) for k, v in asked1.items()}
    asked = {k: v for k, v in asked.items() if v >= args.jobs / 10 or k[1] == "429"}
    print(f"  API requests per job (all clients; {sum(asked.values()) / args.jobs:.1f} in all):")
    for (verb, resource), n in sorted(asked.items(), key=lambda kv: -kv[1]):
        print(f"    {verb:<8} {resource:<22} {n / args.jobs:5.2f}")
    ours = backend.counts
    print(f"  of them the pool service's ({sum(ours.values()) / args.jobs:.2f} in all):")
    for (verb, resource), n in sorted(ours.items(), key=lambda kv: -kv[1]):
        print(f"    {verb:<8} {resource:<22} {n / args.jobs:5.2f}")


if __name__ == "__main__":
    main()
