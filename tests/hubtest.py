"""A real JupyterHub, with the real configurable-http-proxy and the real pool service, for
tests. Tokens for users are made through the hub's REST API by a test service."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import Request, urlopen

import pytest

CHP = Path(sys.prefix) / "node_modules" / ".bin" / "configurable-http-proxy"

HUB_CONFIG = """
import sys
c = get_config()
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = "sqlite:///{dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret = bytes.fromhex("{secret}")
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {users!r}
c.Authenticator.admin_users = {{"admin"}}
c.JupyterHub.load_groups = {groups!r}
c.JupyterHub.custom_scopes = {{"custom:gpushare:admin": {{"description": "pool admin"}}}}
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service=gpushare"]}},
    {{"name": "gpushare-service", "services": ["gpushare"], "scopes": ["read:users", "read:groups", "list:groups", "read:servers"]}},
    {{"name": "tester", "services": ["tester"],
      "scopes": ["admin:users", "tokens", "read:users", "access:services!service=gpushare"]}},
]
c.JupyterHub.services = [
    {{"name": "gpushare", "url": "http://127.0.0.1:{service_port}",
      "command": [sys.executable, "-m", "jupyter_gpushare.pool.supervisor",
                  "--PoolService.config_file={dir}/gpushare_config.py",
                  "--PoolService.state_dir={dir}/pool"],
      "oauth_no_confirm": True, "oauth_client_allowed_scopes": ["custom:gpushare:admin"]}},
    {{"name": "tester", "api_token": "{tester_token}"}},
]
"""


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, and never one this process was given before: the
    ports of one hub are chosen before any is bound, and the kernel may offer a port
    twice (a hub once got its proxy's port for the pool service too)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def need_proxy():
    if not CHP.exists():
        pytest.skip(f"configurable-http-proxy is not installed at {CHP}; the README's test "
                    f"command installs it (npm install --prefix .venv configurable-http-proxy)")


class Hub:
    def __init__(self, directory: Path, groups: dict[str, list[str]], pool_config: str,
                 extra_config: str = ""):
        """``extra_config``: Python appended to the hub's jupyterhub_config.py (``{dir}`` in
        it is this hub's directory), e.g. a spawner and more services or roles."""
        self.dir = directory
        self.port, self.hub_port = free_port(), free_port()
        self.tester_token = secrets.token_hex(16)
        users = {"admin", *(u for members in groups.values() for u in members)}
        # Jobs write their checkpoints here, not into the test users' real homes: a folder
        # of this test's own that every job user can make a folder in (sticky, like /tmp).
        self.scratch = Path(tempfile.mkdtemp(prefix="gpushare-test-scratch-"))
        self.scratch.chmod(0o1777)
        # This machine may have no GPU: the tests choose the labelled stand-in
        (directory / "gpushare_config.py").write_text(
            f"get_config().PoolService.checkpoint_dir_template = "
            f"{str(self.scratch) + '/{user}/{job_id}'!r}\n"
            "get_config().LocalBackend.simulate_gpus = True\n" + pool_config)
        (directory / "jupyterhub_config.py").write_text(HUB_CONFIG.format(
            port=self.port, hub_port=self.hub_port, proxy_api_port=free_port(), chp=str(CHP),
            dir=directory, secret=secrets.token_hex(32), users=users,
            groups={g: {"users": m} for g, m in groups.items()},
            service_port=free_port(), tester_token=self.tester_token)
            + extra_config.replace("{dir}", str(directory)))
        self.url = f"http://127.0.0.1:{self.port}"
        self.pool_url = f"{self.url}/services/gpushare/"
        self.proc = None
        self._tokens: dict[str, str] = {}

    def start(self, timeout: float = 90) -> "Hub":
        log = open(self.dir / "hub.log", "ab")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("jupyterhub")), "-f",
             str(self.dir / "jupyterhub_config.py")], cwd=self.dir, stdout=log, stderr=log,
            start_new_session=True)
        try:
            self.wait_for_pool(timeout)
        except BaseException:
            self.stop()  # no hub left running behind a failed start
            raise
        return self

    def wait_for_pool(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the hub exited; see {self.dir / 'hub.log'}")
            try:
                with urlopen(self.pool_url + "api/openapi.json", timeout=2) as r:
                    if r.status == 200:
                        return
            except (URLError, ConnectionError, OSError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the pool service did not come up; see {self.dir / 'hub.log'}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            # The proxy and the services run in sessions of their own: note them before the
            # hub goes, and kill what a hub that did not clean up leaves behind.
            children = _descendants(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.scratch, ignore_errors=True)

    def token(self, user: str) -> str:
        if user not in self._tokens:
            status, body = self.request(
                "POST", f"{self.url}/hub/api/users/{quote(user, safe='')}/tokens",
                self.tester_token, {"note": "gpushare tests"})
            assert status == 201, body
            self._tokens[user] = body["token"]
        return self._tokens[user]

    def request(self, method: str, url: str, token: str | None = None, body=None,
                raw: bytes | None = None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = Request(url, data=data, method=method)
        if token:
            req.add_header("Authorization", f"token {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urlopen(req, timeout=30) as r:
                status, payload = r.status, r.read()
        except HTTPError as e:
            status, payload = e.code, e.read()
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload.decode(errors="replace")

    def api(self, method: str, path: str, user: str | None = None, body=None, raw=None):
        token = self.token(user) if user else None
        return self.request(method, self.pool_url + path, token, body, raw)

    def service_pids(self) -> list[int]:
        """The pool service's process: not its supervisor, which starts it again, nor the
        spare the supervisor keeps waiting (started after it: the younger one)."""
        found = self._pids(rf"-m jupyter_gpushare\.pool --PoolService\.config_file={self.dir}/")
        return sorted(found, key=_started)[:1]

    def pool_pids(self) -> list[int]:
        """Every process of the pool: the supervisor first, then the service and its spare."""
        return self.supervisor_pids() + self._pids(
            rf"-m jupyter_gpushare\.pool --PoolService\.config_file={self.dir}/")

    def supervisor_pids(self) -> list[int]:
        return self._pids(rf"-m jupyter_gpushare\.pool\.supervisor --PoolService\.config_file="
                          rf"{self.dir}/")

    @staticmethod
    def _pids(pattern: str) -> list[int]:
        out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def wait_job(self, user: str, job_id: str, states, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, job = self.api("GET", f"api/jobs/{job_id}", user)
            if status == 200 and job["state"] in states:
                return job
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} did not reach {states}: {job}")


@contextlib.contextmanager
def running_hub(directory: Path, groups: dict[str, list[str]], pool_config: str,
                extra_config: str = "", users=("alice", "bob", "admin")):
    """A started hub in ``directory`` (readable by the users' jobs), stopped afterwards."""
    need_proxy()
    system_users(users)
    directory.chmod(0o755)
    hub = Hub(directory, groups, pool_config, extra_config).start()
    try:
        yield hub
    finally:
        hub.stop()


def _started(pid: int) -> int:
    """When a process started, in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 1 << 62


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def system_users(names):
    """Demo users as system accounts, as a root JupyterHub needs; skip when not root."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("jobs run as their users only under a root service; this test needs root")
    for name in names:
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--create-home", name], check=True)


def refused_at_start(config_text: str, tmp_path: Path, capsys) -> str:
    """The pool service started with ``config_text`` as its gpushare_config.py stops (a
    non-zero exit) without a traceback; returns what it said on stderr."""
    from jupyter_gpushare.pool.app import PoolService

    config = tmp_path / "gpushare_config.py"
    # this machine may have no GPU: the labelled stand-in, chosen as the hubs' tests choose it
    config.write_text("get_config().LocalBackend.simulate_gpus = True\n" + config_text)
    with pytest.raises(SystemExit) as stopped:
        PoolService().initialize([f"--PoolService.config_file={config}",
                                  f"--PoolService.state_dir={tmp_path / 'state'}"])
    assert stopped.value.code != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err
