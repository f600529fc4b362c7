"""Real IPython kernels (jupyter_client + the venv's ipykernel) for notebook tests, and the
pool backend those tests use.

A kernel gets what a single-user server's kernel gets from JupyterHub: the user's
``JUPYTERHUB_API_TOKEN`` and ``GPUSHARE_URL`` in its environment.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field

from jupyter_client import KernelManager

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.gpus import SimulatedInventory


class ServiceUserBackend(LocalBackend):
    """The local backend as a non-root service runs it (``run_as_service_user``): jobs run as
    the service's own account. The tests run as root, and other accounts cannot execute this
    machine's Python (a pyenv under /root), so a job that runs the kernel's Python must run
    as the service's user. Simulated GPUs, so every machine sees the same pool."""

    def _service_is_root(self):
        return False

    def detect_inventories(self):
        return [SimulatedInventory(f"sim-node-{i}", self.simulated_gpus_per_node)
                for i in range(self.simulated_nodes)]


@dataclass
class Cell:
    """What one execute request produced on iopub, and its reply."""

    status: str = ""
    stdout: str = ""
    stderr: str = ""
    displays: dict = field(default_factory=dict)  # display_id -> latest text/plain
    errors: list = field(default_factory=list)  # (ename, traceback lines)
    result: str | None = None  # text/plain of execute_result
    first_output_at: float | None = None  # monotonic time of the first stream message
    messages: list = field(default_factory=list)

    @property
    def text(self) -> str:
        """Everything shown in the cell, as one string (to look for words or tracebacks)."""
        parts = [self.stdout, self.stderr, *self.displays.values(), self.result or ""]
        parts += ["\n".join(tb) for _, tb in self.errors]
        return "\n".join(parts)

    @property
    def error_line(self) -> str:
        assert len(self.errors) == 1, self.errors
        lines = self.errors[0][1]
        assert len(lines) == 1, lines
        return lines[0]


class Kernel:
    def __init__(self, cwd: str, env: dict[str, str]):
        self.km = KernelManager(kernel_name="python3")
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("JUPYTERHUB_API_TOKEN", "GPUSHARE_URL")}
        self.km.start_kernel(cwd=cwd, env={**clean, **env})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def send(self, code: str, stop_on_error: bool = True) -> str:
        return self.kc.execute(code, stop_on_error=stop_on_error)

    def collect(self, msg_id: str, timeout: float = 60, until=None) -> Cell:
        """Read iopub until the cell is idle (or ``until(cell)`` is true), then its reply."""
        cell = Cell()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the cell did not finish: {cell.text!r}")
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            cell.messages.append(msg)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if cell.first_output_at is None:
                    cell.first_output_at = time.monotonic()
                setattr(cell, content["name"], getattr(cell, content["name"]) + content["text"])
            elif kind in ("display_data", "update_display_data"):
                key = content.get("transient", {}).get("display_id") or len(cell.displays)
                cell.displays[key] = content["data"].get("text/plain", "")
            elif kind == "execute_result":
                cell.result = content["data"].get("text/plain")
            elif kind == "error":
                cell.errors.append((content["ename"], content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                break
            if until is not None and until(cell):
                return cell
        reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        cell.status = reply["content"]["status"]
        return cell

    def run(self, code: str, timeout: float = 60) -> Cell:
        return self.collect(self.send(code), timeout)
