"""The kubelet simulator in a process of its own, for benchmarks: it then shares no
interpreter lock with the caller (the pool service under test), and its CPU time can be read
apart from the caller's (``pid``).

    with KubeletProcess(cp.api, workdir, cert=..., key=..., workers=8) as kubelet:
        kubelet.add_node("gpu-0", gpus=8, labels={...})

Only ``add_node`` is offered; tests that look inside the simulator (``run_of``, devices, pod
resources) use ``KubeletSimulator`` in their own process (harness.KubeCluster).
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

from .rest import KubeREST


def _serve(server: str, token: str, workdir: str, options: dict, conn) -> None:
    """The child: a simulator that adds the nodes it is sent, until told to stop."""
    from .kubelet import KubeletSimulator
    # A connection for each worker, the watch and the heartbeat.
    api = KubeREST(server, token, connections=options.get("workers", 4) + 4)
    simulator = KubeletSimulator(api, Path(workdir), **options).start()
    conn.send(("ready", None))
    try:
        while True:
            request = conn.recv()
            if request[0] == "stop":
                break
            name, kwargs = request[1], request[2]
            try:
                simulator.add_node(name, **kwargs)
                conn.send(("ok", None))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
    except EOFError:                          # the parent went away
        pass
    finally:
        simulator.stop()
        conn.send(("stopped", None))


class KubeletProcess:
    """``KubeletProcess(api, workdir, cert=..., key=..., **simulator_options)``: ``start()``,
    ``add_node(name, **kwargs)`` (KubeletSimulator.add_node's arguments), ``stop()``,
    ``pid``."""

    def __init__(self, api: KubeREST, workdir: Path, *, cert: Path, key: Path, **options):
        self.server = api.server
        self.token = api.headers["Authorization"].split(" ", 1)[1]
        self.workdir = Path(workdir)
        self.options = {"cert": Path(cert), "key": Path(key), **options}
        self.process: multiprocessing.Process | None = None
        self._conn = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 60) -> "KubeletProcess":
        # spawn, not fork: the caller has threads (and maybe an event loop) of its own.
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # The child imports this package as "kube": the tests directory must be on its path.
        tests_dir = str(Path(__file__).resolve().parents[1])
        if tests_dir not in sys.path:
            sys.path.insert(0, tests_dir)
        self.process = ctx.Process(target=_serve, name="kubelet-simulator", daemon=True,
                                   args=(self.server, self.token, str(self.workdir),
                                         self.options, child))
        self.process.start()
        self._expect("ready", timeout)
        return self

    def add_node(self, name: str, **kwargs) -> None:
        self._conn.send(("add", name, kwargs))
        self._expect("ok", 60)

    def stop(self, timeout: float = 30) -> None:
        if self.process is None:
            return
        try:
            self._conn.send(("stop",))
            self._expect("stopped", timeout)
        except (OSError, EOFError, RuntimeError, TimeoutError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.process = None

    def _expect(self, what: str, timeout: float) -> None:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"the kubelet simulator's process did not answer {what!r} "
                               f"within {timeout:g} s")
        kind, detail = self._conn.recv()
        if kind != what:
            raise RuntimeError(f"the kubelet simulator's process answered {kind}: {detail}")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
