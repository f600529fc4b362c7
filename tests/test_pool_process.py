"""The pool service as a process: it answers at once, stops cleanly on SIGTERM (one line, exit
0, jobs left running for the next start to adopt), and its supervisor starts it again within
moments of a crash. No hub: ``api/openapi.json`` needs no token."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import pytest

from hubtest import _started, free_port

CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]}}
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.run_as_service_user = True
"""


@pytest.fixture
def service(tmp_path):
    (tmp_path / "gpushare_config.py").write_text(CONFIG)
    port = free_port()
    env = {**os.environ, "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
           "JUPYTERHUB_SERVICE_PREFIX": "/services/gpushare/", "JUPYTERHUB_API_TOKEN": "x",
           "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api"}
    started = []

    def start(module="jupyter_gpushare.pool"):
        log = open(tmp_path / f"{len(started)}.log", "w+")
        proc = subprocess.Popen([sys.executable, "-m", module,
                                 f"--PoolService.config_file={tmp_path}/gpushare_config.py",
                                 f"--PoolService.state_dir={tmp_path}/state"],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append(proc)
        proc.log, proc.url = log, f"http://127.0.0.1:{port}/services/gpushare/"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def up(url, timeout=20.0) -> float:
    """Seconds until the API answers."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            with urlopen(url + "api/openapi.json", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - began
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"the service did not answer at {url} in {timeout} s")


def text(proc) -> str:
    proc.log.seek(0)
    return proc.log.read()


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def active(supervisor) -> int:
    """The service the supervisor runs: of its two children the older; the other is the
    spare that waits to take over."""
    deadline = time.monotonic() + 10
    while len(found := children(supervisor.pid)) < 2:
        assert time.monotonic() < deadline, "the supervisor keeps no spare"
        time.sleep(0.02)
    return sorted(found, key=_started)[0]


def test_sigterm_stops_cleanly_with_one_line_and_status_0(service):
    proc = service()
    up(proc.url)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    log = text(proc)
    assert "Traceback" not in log and "CancelledError" not in log, log
    stopped = [line for line in log.splitlines() if "Stopping on" in line]
    assert len(stopped) == 1 and "adopted when the service starts again" in stopped[0], log


def test_the_supervisor_starts_a_killed_service_again_at_once(service):
    supervisor = service("jupyter_gpushare.pool.supervisor")
    up(supervisor.url)
    for _ in range(2):
        pool = active(supervisor)
        os.kill(pool, signal.SIGKILL)
        killed = time.monotonic()
        while pool in children(supervisor.pid):
            time.sleep(0.01)
        assert up(supervisor.url) + (time.monotonic() - killed) < 5.0  # 3 s on an idle machine
        assert active(supervisor) != pool
    assert text(supervisor).count("was killed by SIGKILL; starting it again") == 2
    # The hub stopping it: SIGTERM reaches the service, which stops cleanly; status 0; the
    # spare leaves quietly.
    pool, spare = active(supervisor), max(children(supervisor.pid), key=_started)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
    for pid in (pool, spare):
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid):
            assert time.monotonic() < deadline, f"{pid} still runs"
            time.sleep(0.05)
    assert "Traceback" not in text(supervisor)
    assert text(supervisor).count("Stopping on SIGTERM") == 1


def test_the_service_dies_with_a_killed_supervisor(service):
    supervisor = service("jupyter_gpushare.pool.supervisor")
    up(supervisor.url)
    pool = active(supervisor)
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pool}").exists() and "Z" not in _proc_state(pool) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pool}").exists() or "Z" in _proc_state(pool), \
        "an orphaned service would hold the port"


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"
