"""The local demo hub: ``jupyterhub -f hub_config/jupyterhub_config.py``.

A complete JupyterHub on http://127.0.0.1:8000 with the real configurable-http-proxy, demo
users alice (project vision), bob (project nlp) and admin (password: see DEMO_PASSWORD), and
the gpushare pool service on the local backend: the GPUs NVML finds, or a labelled simulated
train pool of 2 nodes x 4 GPUs where there are none. Every notebook server gets a build slice
(¼ GPU by default, ½ GPU for the vision group, or CPU only) from the build pool of
gpushare_config.py, through the gpushare-local spawner.

Run as root (as a real JupyterHub is), the demo users are system accounts (created here when
missing) and every notebook server and train job runs as its user. Run as anyone else, it is
a one-person demo: every server and job runs as you (the service says so in its log).
"""

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("GPUSHARE_DEMO_STATE", HERE.parent / ".demo-state"))
STATE.mkdir(parents=True, exist_ok=True)
DEMO_USERS = {"alice": "vision", "bob": "nlp", "admin": None}
DEMO_PASSWORD = os.environ.get("GPUSHARE_DEMO_PASSWORD", "gpushare")
AS_ROOT = os.geteuid() == 0
HUB_URL = "http://127.0.0.1:8000"
SERVICE_PORT = int(os.environ.get("GPUSHARE_SERVICE_PORT", "10101"))

c = get_config()  # noqa: F821 (JupyterHub provides it)

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = 8000
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")

# The real configurable-http-proxy: installed next to the venv by the README's set-up command.
proxy = Path(sys.prefix) / "node_modules" / ".bin" / "configurable-http-proxy"
c.ConfigurableHTTPProxy.command = [str(proxy) if proxy.exists() else
                                   shutil.which("configurable-http-proxy") or str(proxy)]

c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = DEMO_PASSWORD
c.Authenticator.allowed_users = set(DEMO_USERS)
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {
    "vision": {"users": ["alice"]},
    "nlp": {"users": ["bob"]},
}

# Users may reach the pool service; the service may read users and groups (to know who is an
# admin and who is in which project); notebook servers pass that access on to kernels.
c.JupyterHub.custom_scopes = {
    "custom:gpushare:admin": {"description": "Administer the gpushare train pool."},
}
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=gpushare"]},
    {"name": "gpushare-admin", "users": ["admin"], "scopes": ["custom:gpushare:admin"]},
    # (read:servers and servers: culling idle build sessions reads their activity, stops them)
    {"name": "gpushare-service", "services": ["gpushare"],
     "scopes": ["read:users", "read:groups", "read:servers", "servers"]},
    # the spawner reserves build slices at the pool as a service of its own
    {"name": "gpushare-spawner", "services": ["gpushare-spawner"],
     "scopes": ["access:services!service=gpushare"]},
]
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!user",
                                 "access:services!service=gpushare"]
# GPUSHARE_URL comes from the spawner (gpushare_url below). Servers tell the hub of activity
# every 30 s (default 300), so that culling (gpushare_config.py) sees a session in use soon.
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": "30"}
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120  # JupyterLab can take a while to come up on a small machine

# Build slices: every server gets its profile's slice of a build-pool GPU (pinned by UUID in
# CUDA_VISIBLE_DEVICES, with PyTorch/TensorFlow/JAX/CuPy memory caps), or CPU only.
c.JupyterHub.spawner_class = "gpushare-local"
c.LocalGPUShareSpawner.build_profiles = [
    {"gpus": 0.25, "default": True},
    {"gpus": 0.5, "groups": ["vision"]},
    {"gpus": 0},
]
c.LocalGPUShareSpawner.gpushare_url = f"{HUB_URL}/services/gpushare/"
token_file = STATE / "gpushare-spawner-token"
if not token_file.exists():
    token_file.touch(mode=0o600)
    token_file.write_text(secrets.token_hex(32))
c.LocalGPUShareSpawner.pool_api_token = token_file.read_text().strip()



def _usable_by_others(path: Path) -> bool:
    """Whether other accounts can run this Python (a pyenv under /root, mode 700, cannot be)."""
    for part in [path, *path.parents]:
        if not part.stat().st_mode & 0o001:
            return False
    return True


BIN = Path(sys.executable).parent
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.environment["PATH"] = f"{BIN}:/usr/local/bin:/usr/bin:/bin"  # gpushare in terminals

if AS_ROOT:
    for user in DEMO_USERS:
        if subprocess.run(["id", "-u", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
    python_ok = _usable_by_others(Path(os.path.realpath(sys.executable))) and \
        _usable_by_others(Path(sys.base_prefix) / "lib")
    if not python_ok:
        # Notebook servers then run as the hub's user; train jobs still run as their users.
        print(f"gpushare demo: {sys.base_prefix} cannot be used by other accounts, so notebook "
              f"servers run as the hub's user, in /tmp/<user>; train jobs still run as their "
              f"submitting users.", file=sys.stderr)
    c.LocalGPUShareSpawner.run_as_hub_user = not python_ok
else:
    c.LocalGPUShareSpawner.run_as_hub_user = True  # every server as you, in /tmp/<user>

pool_config = HERE / "gpushare_config.py"
c.JupyterHub.services = [{
    "name": "gpushare",
    "url": f"http://127.0.0.1:{SERVICE_PORT}",
    "command": [sys.executable, "-m", "jupyter_gpushare.pool",
                f"--PoolService.config_file={pool_config}",
                f"--PoolService.state_dir={STATE / 'pool'}"]
               + ([] if AS_ROOT else ["--LocalBackend.run_as_service_user=True"]),
    "cwd": str(STATE),
    "display": True,
}, {
    "name": "gpushare-spawner",  # no process: the identity the spawner reserves slices with
    "api_token": c.LocalGPUShareSpawner.pool_api_token,
    "display": False,
}]
