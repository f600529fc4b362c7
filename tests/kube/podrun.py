"""What the kubelet simulator keeps for one pod it runs: its containers, each either a local
process (the container's command, args, env and workingDir) or a simulated one that runs until
deleted or for the seconds an annotation says. Pure bookkeeping plus subprocess; the API calls
are in kubelet.py."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

PREFIX = "sim.gpushare.jupyter.org"
#: "true"/"false": run the pod's containers as local processes or not (default: the simulator's
#: ``run_commands`` setting, and only containers that have a ``command``).
ANN_RUN_LOCALLY = f"{PREFIX}/run-locally"
#: For simulated (not local) containers: they terminate after this many seconds...
ANN_RUN_SECONDS = f"{PREFIX}/run-seconds"
#: ...with this exit code (default 0).
ANN_EXIT_CODE = f"{PREFIX}/exit-code"

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in env values, command and args ($$ escapes a $)."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _REF.sub(sub, text)


@dataclass
class ContainerRun:
    name: str
    image: str
    local: bool
    proc: subprocess.Popen | None = None
    fake_end: float | None = None        # monotonic deadline of a simulated container
    fake_exit: int = 0
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    started_at: str = ""
    finished_at: str = ""
    restart_count: int = 0
    last_state: dict = field(default_factory=dict)
    restart_at: float | None = None      # monotonic time of the next restart (crash-loop backoff)
    container_id: str = ""

    @property
    def running(self) -> bool:
        return self.exit_code is None and self.restart_at is None

    def poll(self) -> bool:
        """Notices an exit; True when the state changed."""
        if self.exit_code is not None or self.restart_at is not None:
            return False
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is None:
                return False
            self._exited(128 - rc if rc < 0 else rc)
            _killpg(self.proc.pid)        # the container ends with its main process
            return True
        if self.fake_end is not None and time.monotonic() >= self.fake_end:
            self._exited(self.fake_exit)
            return True
        return False

    def _exited(self, code: int):
        self.exit_code = code
        self.reason = "Completed" if code == 0 else "Error"
        self.finished_at = now_iso()

    def terminated_state(self) -> dict:
        return {"terminated": {"exitCode": self.exit_code, "reason": self.reason,
                               "message": self.message or None, "startedAt": self.started_at,
                               "finishedAt": self.finished_at, "containerID": self.container_id}}

    def status(self) -> dict:
        if self.restart_at is not None:
            state = {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": f"back-off restarting failed container {self.name}"}}
        elif self.exit_code is not None:
            state = self.terminated_state()
        else:
            state = {"running": {"startedAt": self.started_at}}
        digest = hashlib.sha256(self.image.encode()).hexdigest()
        return {"name": self.name, "image": self.image,
                "imageID": f"docker-pullable://{self.image.split(':')[0]}@sha256:{digest}",
                "containerID": self.container_id, "ready": self.running, "started": self.running,
                "restartCount": self.restart_count, "state": state,
                "lastState": self.last_state}


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    ip: str
    directory: Path
    restart_policy: str
    started_at: str = field(default_factory=now_iso)
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    terminating: bool = False
    kill_at: float | None = None          # monotonic SIGKILL deadline once terminating
    reported: dict | None = None          # the last status the API server accepted
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # container -> ids

    def log_path(self, container: str, previous: bool = False) -> Path:
        return self.directory / (f"{container}.log" + (".previous" if previous else ""))

    def alive(self) -> list[ContainerRun]:
        return [c for c in self.containers.values() if c.running]

    def phase(self) -> str:
        cs = list(self.containers.values())
        if any(c.exit_code is None for c in cs):
            return "Running"
        return "Succeeded" if all(c.exit_code == 0 for c in cs) else "Failed"

    def status(self, host_ip: str) -> dict:
        phase = self.phase()
        ready = phase == "Running" and all(c.running for c in self.containers.values())
        done = "PodCompleted" if phase != "Running" else "ContainersNotReady"
        cond = [{"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": str(ready), **({} if ready else {"reason": done})},
                {"type": "ContainersReady", "status": str(ready),
                 **({} if ready else {"reason": done})},
                {"type": "PodScheduled", "status": "True"}]
        return {"phase": phase, "conditions": cond, "hostIP": host_ip, "podIP": self.ip,
                "podIPs": [{"ip": self.ip}], "startTime": self.started_at,
                "containerStatuses": [c.status() for c in self.containers.values()]}


def container_env(pod: dict, container: dict, base: dict[str, str], secrets) -> dict[str, str]:
    """The environment of one container: ``base``, then the container's ``env`` in order with
    $(VAR) expansion and the common ``valueFrom`` sources. ``secrets(kind, ns, name)`` reads a
    Secret or ConfigMap's data (already decoded) through the API."""
    env = dict(base)
    meta, status = pod["metadata"], pod.get("status", {})
    fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": pod["spec"].get("nodeName"),
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
              "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", "")}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand(item.get("value", ""), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            value = (meta.get(m.group(1), {}).get(m.group(2)) if m else fields.get(path))
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            kind = "secrets" if "secretKeyRef" in source else "configmaps"
            ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
            value = (secrets(kind, meta["namespace"], ref["name"]) or {}).get(ref["key"])
        else:                             # resourceFieldRef: not simulated
            value = None
        if value is not None:
            env[name] = str(value)
    return env


def decode_data(kind: str, obj: dict) -> dict[str, str]:
    data = obj.get("data") or {}
    if kind == "secrets":
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
    return dict(data)


def default_base_env(home: Path, api_host: str, api_port: int) -> dict[str, str]:
    """What every local container starts from: this Python's bin directory first on PATH (so
    `python`, `jupyterhub-singleuser` resolve to the test venv), a HOME of its own, and the
    in-cluster API variables a pod would see."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8",
            "KUBERNETES_SERVICE_HOST": api_host, "KUBERNETES_SERVICE_PORT": str(api_port)}


def container_argv(spec: dict, env: dict[str, str]) -> list[str]:
    """``command`` + ``args`` with $(VAR) expanded. Images are not simulated, so a container
    without a ``command`` runs its ``args`` as if the image's ENTRYPOINT were empty."""
    return [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]


def new_container_id() -> str:
    return os.urandom(32).hex()


def start_process(run: PodRun, c: ContainerRun, argv: list[str], cwd: str | None,
                  env: dict[str, str], container_id: str | None = None, preexec_fn=None):
    """Starts a container's command as a local process in its own process group; a command
    that cannot start ends the container at once with exit code 128 (StartError).
    ``preexec_fn`` runs in the child before the command (joining the container's cgroups)."""
    cwd = cwd or str(run.directory / "home")
    log = run.log_path(c.name)
    if log.exists():
        log.replace(run.log_path(c.name, previous=True))
    c.started_at = now_iso()
    c.container_id = f"containerd://{container_id or new_container_id()}"
    try:
        with open(log, "wb") as out:
            c.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                      start_new_session=True, preexec_fn=preexec_fn)
    except OSError as e:
        c.proc = None
        c.exit_code, c.reason, c.message = 128, "StartError", str(e)
        c.finished_at = now_iso()


def start_simulated(run: PodRun, c: ContainerRun, annotations: dict):
    c.started_at = now_iso()
    c.container_id = f"containerd://{new_container_id()}"
    run.log_path(c.name).touch()
    seconds = annotations.get(ANN_RUN_SECONDS)
    if seconds is not None:
        c.fake_end = time.monotonic() + float(seconds)
        c.fake_exit = int(annotations.get(ANN_EXIT_CODE, "0"))


def _killpg(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def signal_container(c: ContainerRun, sig: int):
    """SIGTERM goes to the container's main process, as a runtime sends it to PID 1; SIGKILL
    takes the whole process group, as tearing down the container's cgroup would."""
    if c.restart_at is not None:          # in back-off, nothing runs: it stays terminated
        t = c.last_state["terminated"]
        c.restart_at = None
        c.exit_code, c.reason, c.finished_at = t["exitCode"], t["reason"], t["finishedAt"]
        return
    if c.exit_code is not None:
        if c.proc is not None and sig == signal.SIGKILL:
            _killpg(c.proc.pid)           # leftovers of an exited main process
        return
    if c.proc is None:
        # A simulated container "handles" SIGTERM by exiting, like a well-behaved program.
        c._exited(128 + sig)
    elif sig == signal.SIGKILL:
        _killpg(c.proc.pid)
    else:
        try:
            c.proc.send_signal(sig)
        except ProcessLookupError:
            pass
