"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler (1.20, built from Debian's source package by build.sh), with a token file and
self-signed certificates. No kubelet: see kubelet.py for the simulator that plays the nodes.

    bin_dir = ensure_binaries()                 # builds once (~5 min), then cached
    with ControlPlane(bin_dir, tmp_path) as cp:  # ~5 s
        cp.kubeconfig, cp.url, cp.token, cp.api  # api: a KubeREST with the admin token
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import urllib3

from .pki import make_pki
from .rest import KubeError, KubeREST

KUBE_VERSION = os.environ.get("GPUSHARE_KUBE_VERSION", "1.20.2")
BUILD_SH = Path(__file__).with_name("build.sh")
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class ToolchainError(RuntimeError):
    """The binaries could not be built or found; the message says what failed and how to fix it."""


def cache_dir(version: str = KUBE_VERSION) -> Path:
    root = os.environ.get("GPUSHARE_KUBE_CACHE",
                          str(Path.home() / ".cache" / "jupyter-gpushare" / "kube"))
    return Path(root) / version


def ensure_binaries(version: str = KUBE_VERSION, timeout: float = 3600) -> Path:
    """The directory holding the three binaries: the cache when it is complete, else build.sh
    runs (apt-get install + a ~5 minute build, logged to <cache>/build.log)."""
    bin_dir = cache_dir(version) / "bin"
    if all(os.access(bin_dir / c, os.X_OK) for c in COMPONENTS) and os.access(ETCD, os.X_OK):
        return bin_dir
    log = cache_dir(version).parent / f"build-{version}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            r = subprocess.run(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=out,
                               env={**os.environ, "GPUSHARE_KUBE_VERSION": version},
                               timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ToolchainError(f"building Kubernetes {version} failed ({e}); see {log}") from e
    if r.returncode != 0 or not os.access(ETCD, os.X_OK):
        tail = log.read_text(errors="replace")[-1500:]
        raise ToolchainError(
            f"building Kubernetes {version} with {BUILD_SH} failed (exit {r.returncode}); it needs "
            f"root or passwordless sudo for apt-get (golang-1.19-go rsync jq etcd-server) and "
            f"deb.debian.org; run it by hand to see why. Log {log} ends:\n{tail}")
    return Path(r.stdout.decode().strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Component:
    """One control-plane process, its output in ``<workdir>/<name>.log``."""

    def __init__(self, name: str, argv: list[str], workdir: Path, stop_timeout: float = 10):
        self.name, self.argv, self.stop_timeout = name, argv, stop_timeout
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self):
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def rss_mb(self) -> float:
        """Resident memory in MiB (0 when not running)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return 0.0

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on 127.0.0.1.

    ``tokens`` adds users to the static token file: ``{"hub": ["some-group"]}``; their tokens
    are in ``self.tokens`` and ``kubeconfig_for(user)`` writes a kubeconfig for one. The admin
    user ("admin", group system:masters) is always there: ``self.token``. Authorization is RBAC,
    so a non-admin token is as limited as in a real cluster.

    ``extra_args`` appends flags per component, e.g. ``{"kube-scheduler": ["--kube-api-qps=200"]}``
    (the scheduler binds at most 50 pods/s with its default client rate limit)."""

    def __init__(self, bin_dir: Path, workdir: Path, *, tokens: dict[str, list[str]] | None = None,
                 extra_args: dict[str, list[str]] | None = None):
        self.extra_args = extra_args or {}
        self.bin_dir = Path(bin_dir)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        users = {"admin": ["system:masters"],
                 "kube-controller-manager": ["system:masters"],
                 "system:kube-scheduler": []}
        users.update(tokens or {})
        self.tokens = {u: os.urandom(16).hex() for u in users}
        self._groups = users
        self.token = self.tokens["admin"]
        self.kubeconfig = self.kubeconfig_for("admin")
        self.api = KubeREST(self.url, self.token)
        self.pki = make_pki(self.workdir / "pki")
        self.cert_dir = self.workdir / "apiserver-certs"
        self.timings: dict[str, float] = {}
        self._etcd_dir: Path | None = None
        self.components: dict[str, Component] = {}

    # -- files ------------------------------------------------------------------------------
    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig for one of the token users (insecure-skip-tls-verify: loopback only)."""
        path = self.workdir / f"kubeconfig-{user.replace(':', '-')}"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: sim\n  cluster:\n    server: {self.url}\n"
            "    insecure-skip-tls-verify: true\n"
            f"users:\n- name: {user}\n  user:\n    token: {self.tokens[user]}\n"
            f"contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: {user}\n"
            "current-context: sim\n")
        path.chmod(0o600)
        return path

    def _token_file(self) -> Path:
        path = self.workdir / "tokens.csv"
        lines = [f'{t},{u},{u},"{",".join(self._groups[u])}"' for u, t in self.tokens.items()]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, timeout: float = 90):
        t0 = time.monotonic()
        # etcd on tmpfs when there is one: fsync there costs nothing, and tests need no durability.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self._etcd_dir = Path(tempfile.mkdtemp(prefix="gpushare-etcd-", dir=shm))
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._add("etcd", [
            ETCD, "--name=sim", f"--data-dir={self._etcd_dir}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=sim=http://127.0.0.1:{peer}",
            "--listen-metrics-urls=", "--log-level=warn", "--logger=zap"])
        self._wait(lambda: self._http_ok(f"{self.etcd_url}/health"), "etcd", timeout)
        self.timings["etcd_s"] = time.monotonic() - t0

        self._add("kube-apiserver", self._apiserver_argv())
        self._wait_apiserver(timeout)
        self.timings["apiserver_s"] = time.monotonic() - t0 - self.timings["etcd_s"]

        # They need the apiserver's own certificate (root CA for service-account secrets).
        cm_port, sched_port = free_port(), free_port()
        kc = str(self.kubeconfig_for("kube-controller-manager"))
        self._add("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            # No real kubelets post heartbeats the way nodelifecycle expects: it would taint and
            # evict the simulated nodes.
            "--controllers=*,-nodelifecycle", "--leader-elect=false",
            f"--service-account-private-key-file={self.pki['sa.key']}",
            f"--root-ca-file={self.cert_dir / 'apiserver.crt'}",
            "--bind-address=127.0.0.1", f"--secure-port={cm_port}", "--port=0",
            f"--cert-dir={self.workdir / 'cm-certs'}", "--v=0"])
        kc = str(self.kubeconfig_for("system:kube-scheduler"))
        self._add("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
            "--port=0", f"--cert-dir={self.workdir / 'sched-certs'}", "--v=0"])
        for name, port in (("kube-controller-manager", cm_port), ("kube-scheduler", sched_port)):
            self._wait(lambda p=port: self._http_ok(f"https://127.0.0.1:{p}/healthz"), name,
                       timeout)
        self.wait_service_account("default", timeout)
        self.timings["start_s"] = time.monotonic() - t0
        return self

    def stop(self):
        # The apiserver before etcd: the other way round it hangs retrying.
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.components:
                self.components[name].stop()
        if self._etcd_dir:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)
            self._etcd_dir = None

    def restart_apiserver(self, down_s: float = 0.0, timeout: float = 60) -> float:
        """Stops the API server (open watches break, requests fail), waits ``down_s`` seconds,
        starts it again on the same port and returns the seconds until it was ready again."""
        api = self.components["kube-apiserver"]
        api.stop()
        time.sleep(down_s)
        t0 = time.monotonic()
        api.start()
        self._wait_apiserver(timeout)
        return time.monotonic() - t0

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    def rss_mb(self) -> dict[str, float]:
        return {name: c.rss_mb() for name, c in self.components.items()}

    # -- helpers ----------------------------------------------------------------------------
    def create_namespace(self, name: str, labels: dict | None = None, timeout: float = 30):
        """Creates a namespace and waits until pods can be created in it (its default service
        account and that account's token exist: 1.20's ServiceAccount admission needs both)."""
        self.api.post("/api/v1/namespaces",
                      {"metadata": {"name": name, "labels": labels or {}}})
        self.wait_service_account(name, timeout)

    def wait_service_account(self, namespace: str, timeout: float = 30):
        def ready():
            try:
                sa = self.api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            except KubeError:
                return False
            return bool(sa.get("secrets"))
        self._wait(ready, f"the default service account of {namespace}", timeout)

    def _apiserver_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.cert_dir}", f"--token-auth-file={self._token_file()}",
            "--authorization-mode=RBAC", "--anonymous-auth=false",
            "--service-cluster-ip-range=10.96.0.0/16",
            f"--service-account-key-file={self.pki['sa.key']}",
            f"--service-account-signing-key-file={self.pki['sa.key']}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            # Admission: 1.20's default plugins (ServiceAccount, TaintNodesByCondition,
            # ResourceQuota, ...; the webhook ones are inert with no webhooks registered).
            # Pod logs: the apiserver calls the kubelet simulator over HTTPS and verifies it.
            f"--kubelet-certificate-authority={self.pki['kubelet-ca.crt']}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--kubelet-timeout=10s",
            "--profiling=false", "--v=0"]

    def _add(self, name: str, argv: list[str]):
        # The apiserver stops listening at once on SIGTERM but lingers ~10 s more (its endpoint
        # reconciler retries against itself): after 2 s it is killed.
        argv = argv + list(self.extra_args.get(name, []))
        c = Component(name, argv, self.workdir, 2 if name == "kube-apiserver" else 10)
        self.components[name] = c
        c.start()

    def _wait_apiserver(self, timeout: float):
        self._wait(lambda: self._http_ok(f"{self.url}/readyz", self.token), "kube-apiserver",
                   timeout)

    _pool = urllib3.PoolManager(cert_reqs="CERT_NONE", retries=False)

    def _http_ok(self, url: str, token: str | None = None) -> bool:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            return self._pool.request("GET", url, headers=headers, timeout=2).status == 200
        except urllib3.exceptions.HTTPError:
            return False

    def _wait(self, ready, what: str, timeout: float):
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [c for c in self.components.values() if not c.alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited while waiting for {what}; its log "
                                   f"({dead[0].log}) ends:\n{dead[0].tail()}")
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {c.name}\n{c.tail(800)}" for c in self.components.values())
                raise TimeoutError(f"{what} was not ready after {timeout:.0f} s\n{logs}")
            time.sleep(0.1)
