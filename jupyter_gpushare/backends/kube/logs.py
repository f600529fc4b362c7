"""The logs and exit records of job pods: read from the API while an attempt runs, kept in
``state_dir`` when it ends, so that they outlive the pods.

Per attempt, ``state_dir/<job>/`` holds ``<attempt>.log`` (rank 0's pod's log, as ever),
``<attempt>.pod<N>.log`` (the pod of node rank N), and ``<attempt>.exit``: how the attempt
ended, with its pods' ranks (``gang.PodRanks``), written before its pods are deleted. A pod's
log is read once when it ended by itself, or followed to the end while a stop's grace period
runs. A per-GPU pod's log holds all its ranks' lines (``launcher.split`` tells them apart).
"""

from __future__ import annotations

import json
import logging
import os
import time

from .. import launcher
from ..base import Exit
from .api import KubeAPI, KubeError
from .gang import PodRanks, layout_of
from .objects import label_value

LOG_CACHE_S = 0.5


class PodLogs:
    def __init__(self, state_dir: str, namespace: str, follow_timeout_s: float,
                 log: logging.Logger):
        self.state_dir, self.namespace = state_dir, namespace
        self.follow_timeout_s = follow_timeout_s
        self.log = log
        self.api: KubeAPI | None = None  # set once the backend is connected
        self._cache: dict[str, tuple[float, bytes]] = {}

    # -- files ----------------------------------------------------------------------------

    def path(self, key, kind: str) -> str:
        job_id, attempt = key
        return os.path.join(self.state_dir, label_value(job_id), f"{int(attempt)}.{kind}")

    def pod_path(self, key, index: int) -> str:
        return self.path(key, "log" if index == 0 else f"pod{int(index)}.log")

    def write(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def record_exit(self, key, exit: Exit, pods) -> None:
        self.write(self.path(key, "exit"), json.dumps({
            "state": exit.state, "exit_code": exit.exit_code, "reason": exit.reason,
            "pods": [p.record() for p in pods]}).encode())

    def _exit_record(self, key) -> dict | None:
        try:
            with open(self.path(key, "exit")) as f:
                record = json.load(f)
            return record if isinstance(record, dict) else None
        except (OSError, ValueError):
            return None

    def read_exit(self, key) -> Exit | None:
        record = self._exit_record(key)
        try:
            return Exit(*key, record["state"], record.get("exit_code"), record.get("reason", ""))
        except (TypeError, KeyError):
            return None

    def kept_layout(self, key) -> tuple[PodRanks, ...]:
        """The pods of an ended attempt (an older record: rank 0's pod only)."""
        record = self._exit_record(key) or {}
        try:
            return layout_of(record.get("pods")) or (PodRanks("", 0),)
        except (TypeError, ValueError, KeyError):
            return (PodRanks("", 0),)

    def read_kept(self, key, index: int) -> bytes:
        try:
            with open(self.pod_path(key, index), "rb") as f:
                return f.read()
        except OSError:
            return b""

    # -- from the API ---------------------------------------------------------------------

    async def archive(self, key, index: int, pod: str) -> None:
        """Keep a pod's whole log, read once (not again if it is kept already)."""
        path = self.pod_path(key, index)
        if os.path.exists(path):
            return
        try:
            data = await self.api.raw(f"read the log of {pod}",
                                      self.api.core.read_namespaced_pod_log, pod,
                                      self.namespace, retry_s=5)
        except KubeError as e:
            data = f"[gpushare: the log could not be read from Kubernetes: {e}]\n".encode()
        self.write(path, data)

    async def follow(self, key, index: int, pod: str) -> None:
        """A pod's log to its file until the container ends (a stop's grace period)."""
        path = self.pod_path(key, index)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            response = await self.api.core.read_namespaced_pod_log(
                pod, self.namespace, follow=True, _preload_content=False,
                _request_timeout=(10, self.follow_timeout_s))
            try:
                if response.status != 200:
                    return
                with open(path, "wb") as f:
                    async for chunk in response.content.iter_any():
                        f.write(chunk)
                        f.flush()
            finally:
                response.release()
        except Exception as e:  # the log is kept as far as it came
            self.log.info("Following the log of %s stopped: %s", pod, e)

    async def read_live(self, pod: str) -> bytes:
        """A running pod's log so far (read at most every LOG_CACHE_S for all readers)."""
        cached = self._cache.get(pod)
        if cached is None or time.monotonic() - cached[0] > LOG_CACHE_S:
            try:
                data = await self.api.raw(f"read the log of {pod}",
                                          self.api.core.read_namespaced_pod_log, pod,
                                          self.namespace, retry_s=2)
            except KubeError:  # not started yet (400), or the API is away: nothing new
                return cached[1] if cached else b""
            cached = self._cache[pod] = (time.monotonic(), data)
        return cached[1]

    def forget(self, pod: str) -> None:
        self._cache.pop(pod, None)


def rank_output(data: bytes, pod: PodRanks, rank: int) -> bytes:
    """One rank's output from its pod's log."""
    return launcher.split(data, rank, pod.first) if pod.prefixed else data
