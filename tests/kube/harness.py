"""The control plane and the kubelet simulator together, with the waits tests need. Used by the
pytest fixtures (fixtures.py) and by benchmarks:

    import sys; sys.path.insert(0, "tests")
    from kube.harness import KubeCluster
    with KubeCluster(workdir) as kc:
        kc.kubelet.add_node("gpu-0", gpus=8, labels={...})
        ns = kc.namespace("bench")
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from .cluster import ControlPlane, ensure_binaries
from .kubelet import KubeletSimulator
from .rest import KubeError

_names = itertools.count()


class KubeCluster:
    """``control_plane`` (ControlPlane) + ``kubelet`` (KubeletSimulator). ``kubeconfig``,
    ``url``, ``token`` and ``api`` are the admin's. ``tokens``/``extra_args`` go to the
    ControlPlane; other keyword arguments to the simulator (``run_commands``, ``start_delay_s``,
    ``heartbeat_s``, ``base_env``, ``workers``)."""

    def __init__(self, workdir: Path, *, bin_dir: Path | None = None,
                 tokens: dict[str, list[str]] | None = None,
                 extra_args: dict[str, list[str]] | None = None, **kubelet_options):
        self.workdir = Path(workdir)
        self.extra_args = extra_args
        self.bin_dir = bin_dir
        self.tokens = tokens
        self.kubelet_options = kubelet_options
        self.control_plane: ControlPlane | None = None
        self.kubelet: KubeletSimulator | None = None
        self.timings: dict[str, float] = {}

    def start(self):
        t0 = time.monotonic()
        bin_dir = self.bin_dir or ensure_binaries()
        self.timings["binaries_s"] = time.monotonic() - t0
        cp = self.control_plane = ControlPlane(bin_dir, self.workdir / "control-plane",
                                               tokens=self.tokens, extra_args=self.extra_args)
        cp.start()
        self.timings.update(cp.timings)
        self.kubelet = KubeletSimulator(cp.api, self.workdir / "kubelet",
                                        cert=cp.pki["kubelet.crt"], key=cp.pki["kubelet.key"],
                                        **self.kubelet_options).start()
        self.timings["total_s"] = time.monotonic() - t0
        return self

    def stop(self):
        if self.kubelet:
            self.kubelet.stop()
        if self.control_plane:
            self.control_plane.stop()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def url(self) -> str:
        return self.control_plane.url

    @property
    def token(self) -> str:
        return self.control_plane.token

    @property
    def api(self):
        return self.control_plane.api

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of each control-plane process and of this (simulator) process."""
        rss = self.control_plane.rss_mb()
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss["this process (kubelet simulator + caller)"] = int(line.split()[1]) / 1024
        return rss

    # -- conveniences -----------------------------------------------------------------------
    def namespace(self, prefix: str = "test", labels: dict | None = None) -> str:
        """A new namespace ``<prefix>-<n>-<pid>`` in which pods can be created at once."""
        name = f"{prefix}-{next(_names)}-{os.getpid()}"
        self.control_plane.create_namespace(name, labels)
        return name

    def pod(self, namespace: str, name: str) -> dict | None:
        try:
            return self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def wait_pod(self, namespace: str, name: str, until, timeout: float = 20) -> dict | None:
        """Polls a pod until ``until(pod_or_None)`` is true; returns it. ``until`` may be a
        phase name ("Running", "Succeeded", ...) or None meaning "deleted"."""
        if until is None:
            check = lambda p: p is None  # noqa: E731
        elif isinstance(until, str):
            check = lambda p: p is not None and p.get("status", {}).get("phase") == until  # noqa: E731
        else:
            check = until
        deadline = time.monotonic() + timeout
        while True:
            pod = self.pod(namespace, name)
            if check(pod):
                return pod
            if time.monotonic() > deadline:
                status = pod and pod.get("status")
                raise TimeoutError(f"pod {namespace}/{name} did not reach {until!r} in "
                                   f"{timeout} s; status: {status}")
            time.sleep(0.1)

    def events(self, namespace: str, name: str) -> list[dict]:
        """Events about one object (the scheduler's FailedScheduling, ...)."""
        items = self.api.get(f"/api/v1/namespaces/{namespace}/events",
                             fieldSelector=f"involvedObject.name={name}")["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or "")

    def logs(self, namespace: str, name: str, container: str | None = None, **query) -> str:
        """The pod's log through the API server (which asks the simulator's kubelet port)."""
        if container:
            query["container"] = container
        return self.api.text(f"/api/v1/namespaces/{namespace}/pods/{name}/log", **query)
