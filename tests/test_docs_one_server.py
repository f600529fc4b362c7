"""The how-to "Add gpushare to an existing JupyterHub on one GPU server" (docs/howto/one-server.md),
followed on this machine as an admin would.

An "existing hub" is made the way the guide assumes one (JupyterHub's ground-up installation: a
Python environment that every account can run, in a folder of this test's own instead of
/opt/jupyterhub). Then the guide's own commands run, taken from the page, and its own
configuration files are used, taken from the files the page includes. Only what must move for
a test is changed, each by a named substitution: /opt/jupyterhub, /var/lib/gpushare, the
service's port, the clone's path, ``sudo`` (the test is root), the restart (the test starts
the hub itself instead of systemd) and ``nvidia-smi -L`` (this machine has no GPU). The test's
own lines come after the guide's: the hub's ports and database, a login for the test users,
their homes and checkpoints in folders of this test's own.

Then the hub is used as the guide's "Check that it works" says: alice's default server starts
with a ¼ slice of the build GPU, ``gpushare pool`` and ``gpushare quota`` answer in her
name, and a job she submits with ``gpushare submit --wait`` runs as her account on a GPU of
the train pool, never on the build pool's."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest

import hubtest
from hubtest import CHP, free_port, need_proxy, system_users

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "howto" / "one-server.md"
FILES = REPO / "docs" / "howto" / "one-server"
BASE_PYTHON = "/usr/bin/python3"

# The "existing" hub: what an admin's jupyterhub_config.py holds before the guide. The test's
# own lines (ports, a login for test users, a service to make their tokens) are here too.
EXISTING = """\
c = get_config()  # noqa: F821
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = "sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{state}/jupyterhub_cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{"alice", "bob", "admin"}}
c.Authenticator.admin_users = {{"admin"}}
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120
c.JupyterHub.services = [{{"name": "tester", "api_token": "{tester_token}"}}]
c.JupyterHub.load_roles = [{{"name": "tester", "services": ["tester"],
                            "scopes": ["admin:users", "tokens", "servers", "read:users"]}}]
"""

# After the guide's lines: servers' homes and jobs' checkpoints in this test's folders, not in
# the test accounts' real homes.
RELOCATE_HOMES = """
c.LocalGPUShareSpawner.user_home_template = "{homes}/{{username}}"
"""
RELOCATE_CHECKPOINTS = """
c.PoolService.checkpoint_dir_template = "{homes}/{{user}}/.gpushare/checkpoints/{{job_id}}"
c.LocalBackend.simulate_gpus = True  # this machine has no GPU (docs: "Where NVML finds none")
"""


def named_blocks(page: Path) -> dict[str, str]:
    """The code blocks of a MyST page that carry a ``:name:``, by name."""
    blocks = {}
    for match in re.finditer(r"```\{code-block\} \w+\n\s*:name: ([\w-]+)\n\s*\n(.*?)\n\s*```",
                             page.read_text(), re.S):
        blocks[match[1]] = "\n".join(line.strip() for line in match[2].splitlines())
    return blocks


def commands(block: str) -> list[str]:
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]


def test_the_guide_shows_the_files_the_test_uses():
    text = GUIDE.read_text()
    for name in ("gpushare_config.py", "jupyterhub_config.py"):
        assert f"```{{literalinclude}} one-server/{name}\n" in text
    blocks = named_blocks(GUIDE)
    assert {"one-server-install", "one-server-token", "one-server-groups",
            "one-server-restart", "one-server-check"} <= blocks.keys()


class GuideHub(hubtest.Hub):
    """The hub of the guide: its jupyterhub_config.py is the existing one, the guide's lines
    and this test's relocations; it runs from the guide's environment."""

    def __init__(self, top: Path, prefix: Path, config: str):
        self.dir = top / "state"
        self.dir.mkdir(mode=0o700)
        self.prefix = prefix
        self.port, self.hub_port = free_port(), free_port()
        self.tester_token = secrets.token_hex(16)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpushare-test-scratch-"))
        self.url = f"http://127.0.0.1:{self.port}"
        self.pool_url = f"{self.url}/services/gpushare/"
        self.proc = None
        self._tokens = {}
        self.config = EXISTING.format(
            port=self.port, hub_port=self.hub_port, proxy_api_port=free_port(), chp=str(CHP),
            state=self.dir, tester_token=self.tester_token) + config

    def start(self, timeout: float = 120) -> "GuideHub":
        etc = self.prefix / "etc" / "jupyterhub"
        (etc / "jupyterhub_config.py").write_text(self.config)
        log = open(self.dir / "hub.log", "ab")
        path = f"{self.prefix / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        self.proc = subprocess.Popen(
            [str(self.prefix / "bin" / "jupyterhub"), "-f", str(etc / "jupyterhub_config.py")],
            cwd=self.dir, stdout=log, stderr=log, start_new_session=True,
            env={"PATH": path, "HOME": "/root", "LANG": "C.UTF-8"})
        self.wait_for_pool(timeout)
        return self


def run(command: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(command, shell=True, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def guide_hub():
    need_proxy()
    if os.geteuid() != 0:
        pytest.skip("SKIPPED LOUDLY: the guide is for a hub run as root (servers and jobs run "
                    "as their users' accounts); run the tests as root to follow it")
    if not shutil.which("openssl") or not os.path.exists(BASE_PYTHON):
        pytest.skip(f"SKIPPED LOUDLY: the guide needs openssl and {BASE_PYTHON} "
                    "(apt-get install openssl python3-venv)")
    system_users(["alice", "bob", "admin"])
    top = Path(tempfile.mkdtemp(prefix="gpushare-guide-"))
    top.chmod(0o755)  # the environment must be usable by alice, as /opt/jupyterhub is
    prefix, state = top / "opt" / "jupyterhub", top / "var" / "lib" / "gpushare"
    homes = top / "homes"
    homes.mkdir(mode=0o755)
    state.parent.mkdir(parents=True)
    port = free_port()
    # The release's wheel, built from this checkout as docs/howto/release.md says (here
    # without a build environment of its own: the test's has the build's requirements)
    dist = top / "dist"
    run(f"{shlex.quote(sys.executable)} -m build --no-isolation --outdir {dist} "
        f"{shlex.quote(str(REPO))}")
    (wheel,) = dist.glob("jupyter_gpushare-*-py3-none-any.whl")
    (sdist,) = dist.glob("jupyter_gpushare-*.tar.gz")
    substitute = {
        "/opt/jupyterhub": str(prefix), "/var/lib/gpushare": str(state),
        "http://127.0.0.1:10101": f"http://127.0.0.1:{port}",
        "./jupyter_gpushare-*.whl": shlex.quote(str(wheel)), "sudo ": "",
        "nvidia-smi -L": "sh -c 'echo gpus $CUDA_VISIBLE_DEVICES uid $(id -u)'",
    }

    def moved(text: str) -> str:
        for old, new in substitute.items():
            text = text.replace(old, new)
        return text

    blocks = named_blocks(GUIDE)
    # The existing hub: JupyterHub and JupyterLab in an environment every account can run.
    run(f"{BASE_PYTHON} -m venv {prefix}")
    run(f"{prefix}/bin/python3 -m pip install --quiet --disable-pip-version-check "
        f"jupyterhub jupyterlab")
    (prefix / "etc" / "jupyterhub").mkdir(parents=True)
    # 1. Install; 2. the pool's configuration; 3. the spawner's token.
    old_umask = os.umask(0o022)
    try:
        for command in commands(blocks["one-server-install"]):  # no Node.js on PATH
            assert "./jupyter_gpushare-*.whl" in command
            run(moved(command) + " --quiet --disable-pip-version-check", cwd=top,
                env={"PATH": str(prefix / "bin"), "HOME": "/root", "LANG": "C.UTF-8"})
    finally:
        os.umask(old_umask)
    release = wheel.name.split("-")[1]
    assert sdist.name == f"jupyter_gpushare-{release}.tar.gz"
    assert run(f"{prefix}/bin/gpushare --version").stdout == f"gpushare {release}\n"
    assert (prefix / "share/jupyter/labextensions/jupyter-gpushare/package.json").is_file()
    (prefix / "etc" / "jupyterhub" / "gpushare_config.py").write_text(
        moved((FILES / "gpushare_config.py").read_text())
        + RELOCATE_CHECKPOINTS.format(homes=homes))
    for command in commands(blocks["one-server-token"]):
        run(moved(command))
    # 4. The guide's lines after the existing ones; 5. the groups; 6. (re)start.
    hub = GuideHub(top, prefix, moved((FILES / "jupyterhub_config.py").read_text())
                   + "\n" + blocks["one-server-groups"] + "\n"
                   + RELOCATE_HOMES.format(homes=homes))
    assert commands(blocks["one-server-restart"]) == ["sudo systemctl restart jupyterhub"]
    try:
        hub.start()
        yield {"hub": hub, "prefix": prefix, "state": state, "homes": homes,
               "check": [moved(c) for c in commands(blocks["one-server-check"])]}
    finally:
        hub.stop()
        subprocess.run(["pkill", "-KILL", "-f", str(prefix)], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def _wait_for_server(hub, user: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, info = hub.request("GET", f"{hub.url}/hub/api/users/{quote(user)}",
                                   hub.tester_token)
        server = (info.get("servers") or {}).get("") if status == 200 else None
        if server and server.get("ready"):
            return server
        time.sleep(0.5)
    pytest.fail(f"{user}'s server did not start: {(hub.dir / 'hub.log').read_text()[-3000:]}")


def test_the_guide_gives_a_working_hub(guide_hub):
    hub, prefix, state = guide_hub["hub"], guide_hub["prefix"], guide_hub["state"]
    # The service keeps its database where the guide says, private to root.
    assert (state / "gpushare.sqlite").exists()
    assert state.stat().st_mode & 0o777 == 0o700
    # alice's default server: a ¼ slice of the build GPU.
    status, _ = hub.request("POST", f"{hub.url}/hub/api/users/alice/server", hub.tester_token)
    assert status in (201, 202), status
    _wait_for_server(hub, "alice")
    status, slices = hub.api("GET", "api/slices", "alice")
    assert status == 200, slices
    [held] = slices["slices"]
    assert held["user"] == "alice" and held["gpus"] == 0.25, held
    assert held["node"] == socket.gethostname() and held["gpu"] == 0, held
    # The checks of the guide, in alice's name, as from her server's terminal.
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "GPUSHARE_URL": hub.pool_url,
           "JUPYTERHUB_API_TOKEN": hub.token("alice"), "LANG": "C.UTF-8"}
    pool, quota, submit = guide_hub["check"]
    assert pool == "gpushare pool" and quota == "gpushare quota"
    out = run(pool, env=env).stdout
    assert "simulated" in out.lower() or "GPU" in out, out
    out = run(quota, env=env).stdout
    assert "vision" in out and "3" in out, out
    done = run(submit, env=env)
    line = next(line for line in done.stdout.splitlines() if line.startswith("gpus "))
    gpus, uid = line.split()[1], int(line.split()[-1])
    alice = subprocess.run(["id", "-u", "alice"], capture_output=True, text=True).stdout
    assert uid == int(alice), line  # the job ran as alice, not as root
    [uuid] = gpus.split(",")
    assert uuid.startswith("GPU-SIMULATED-sim-node-"), line  # a train GPU, not the build GPU
    assert "succeeded" in done.stderr, done.stderr
