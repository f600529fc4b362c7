"""The local demo hub: ``jupyterhub -f hub_config/jupyterhub_config.py``.

A complete JupyterHub on http://127.0.0.1:8000 with the real configurable-http-proxy, demo
users alice (project vision), bob (project nlp) and admin (the passwords are made on the
first run, kept in .demo-state/demo-password and demo-admin-password and said in the log), and the gpushare pool service
on the local backend: the GPUs NVML finds, or a labelled simulated train pool of 2 nodes x 4
GPUs where there are none. Every notebook server gets a build slice (¼ GPU by default, ½ GPU
for the vision group, or CPU only) from the build pool of gpushare_config.py, through the
gpushare-local spawner.

Run as root (as a real JupyterHub is), the demo users are system accounts (created here when
missing) and every notebook server and train job runs as its user, never as root. Where other
accounts cannot run the hub's Python (a pyenv under /root), servers and jobs run from a
notebook environment built once from the system's python3 (demo_env.py). Run as anyone else,
it is a one-person demo: every server and job runs as you (the service says so in its log).

Environment: GPUSHARE_DEMO_STATE (state folder), GPUSHARE_DEMO_PORT (8000),
GPUSHARE_DEMO_HUB_PORT (8081), GPUSHARE_DEMO_PROXY_API_PORT (8001), GPUSHARE_SERVICE_PORT
(10101), GPUSHARE_DEMO_PASSWORD, GPUSHARE_DEMO_ADMIN_PASSWORD, GPUSHARE_DEMO_ENV
(/opt/jupyter-gpushare/demo-env-<digest of the checkout's path>, one per clone), and
GPUSHARE_DEMO_HOMES (servers' homes and job checkpoints in <folder>/<user>, not the
accounts' own homes).
"""

import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import demo_env  # noqa: E402

from jupyter_gpushare.dashboard import HUB_TEMPLATES  # noqa: E402

STATE = Path(os.environ.get("GPUSHARE_DEMO_STATE", HERE.parent / ".demo-state"))
STATE.mkdir(mode=0o700, parents=True, exist_ok=True)
os.chmod(STATE, 0o700)  # the hub's database, cookie secret, tokens and password
DEMO_USERS = {"alice": "vision", "bob": "nlp", "carol": "speech", "admin": None}
AS_ROOT = os.geteuid() == 0


def _port(variable: str, default: int) -> int:
    value = os.environ.get(variable) or str(default)
    if not (value.isdigit() and 1 <= int(value) <= 65535):
        sys.exit(f"gpushare demo: {variable}={value!r} is not a port; give a number from 1 to "
                 f"65535 (the default is {default}).")
    return int(value)


PORT = _port("GPUSHARE_DEMO_PORT", 8000)
SERVICE_PORT = _port("GPUSHARE_SERVICE_PORT", 10101)
HUB_PORT = _port("GPUSHARE_DEMO_HUB_PORT", 8081)
PROXY_API_PORT = _port("GPUSHARE_DEMO_PROXY_API_PORT", 8001)


def _taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _proxy_of_ours_alive() -> bool:
    """The proxy a hub of this state folder left running (the hub takes it over)."""
    try:
        os.kill(int((STATE / "jupyterhub-proxy.pid").read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


# A port another program holds would fail later, in the proxy's or the service's log: say it
# first, with the setting that moves it.
for _variable, _number, _ours in (("GPUSHARE_DEMO_PORT", PORT, "proxy"),
                                ("GPUSHARE_DEMO_PROXY_API_PORT", PROXY_API_PORT, "proxy"),
                                ("GPUSHARE_DEMO_HUB_PORT", HUB_PORT, ""),
                                ("GPUSHARE_SERVICE_PORT", SERVICE_PORT, "")):
    if _taken(_number) and not (_ours and _proxy_of_ours_alive()):
        sys.exit(f"gpushare demo: port {_number} on 127.0.0.1 is taken by another program; "
                 f"stop it, or give the demo another port, e.g. "
                 f"{_variable}={_number % 60000 + 10} before the command "
                 f"(docs/tutorials/demo.md lists the ports).")


def _secret_file(path: Path, make) -> str:
    """A file only the hub's user can read, made once."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make())
    return path.read_text().strip()


# Passwords of this machine's own: on a published one, anyone who reaches the hub could log
# in as the demo's users or its admin. JupyterHub's shared-password authenticator wants the
# admin's to differ and to have 32 characters at least.
DEMO_PASSWORD = os.environ.get("GPUSHARE_DEMO_PASSWORD") or _secret_file(
    STATE / "demo-password", lambda: secrets.token_urlsafe(9))
ADMIN_PASSWORD = os.environ.get("GPUSHARE_DEMO_ADMIN_PASSWORD") or _secret_file(
    STATE / "demo-admin-password", lambda: secrets.token_urlsafe(24))

c = get_config()  # noqa: F821 (JupyterHub provides it)

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = PORT
c.JupyterHub.hub_port = HUB_PORT
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")

# The real configurable-http-proxy: installed next to the venv by the README's set-up command.
proxy = Path(sys.prefix) / "node_modules" / ".bin" / "configurable-http-proxy"
c.ConfigurableHTTPProxy.command = [str(proxy) if proxy.exists() else
                                   shutil.which("configurable-http-proxy") or str(proxy)]

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = DEMO_PASSWORD
c.SharedPasswordAuthenticator.admin_password = ADMIN_PASSWORD
c.Authenticator.allowed_users = set(DEMO_USERS)
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {
    "vision": {"users": ["alice"]},
    "nlp": {"users": ["bob"]},
    "speech": {"users": ["carol"]},
}

# Users may reach the pool service; the service may read users and groups (to know who is an
# admin and who is in which project); notebook servers pass that access on to kernels.
c.JupyterHub.custom_scopes = {
    "custom:gpushare:admin": {"description": "Administer the gpushare train pool."},
}
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=gpushare"]},
    {"name": "gpushare-admin", "users": ["admin"], "scopes": ["custom:gpushare:admin"]},
    # read:servers: which servers the hub runs (stale slices), their activity (culling);
    # servers: culling stops idle build sessions
    {"name": "gpushare-service", "services": ["gpushare"],
     "scopes": ["read:users", "read:groups", "list:groups", "read:servers", "servers"]},
    # the spawner reserves build slices at the pool as a service of its own
    {"name": "gpushare-spawner", "services": ["gpushare-spawner"],
     "scopes": ["access:services!service=gpushare"]},
]
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!user",
                                 "access:services!service=gpushare"]
# GPUSHARE_URL comes from the spawner: the hub's own address. Servers tell the hub of activity
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
# Servers on the hub's machine reach the pool straight, not through the proxy: one hop less,
# and when the hub stops (its services first, then the servers) their last requests meet a
# closed port, which they take quietly, not the proxy's 503 pages.
c.LocalGPUShareSpawner.gpushare_url = f"http://127.0.0.1:{SERVICE_PORT}/services/gpushare/"
c.LocalGPUShareSpawner.pool_api_token = _secret_file(STATE / "gpushare-spawner-token",
                                                     lambda: secrets.token_hex(32))

# Which Python runs the notebook servers (and so the kernels, terminals and %%train jobs).
if AS_ROOT:
    for user in DEMO_USERS:
        if subprocess.run(["id", "-u", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
    if demo_env.python_usable_by_others(sys.executable):
        BIN = Path(sys.executable).parent
        STARTUP = None  # the package the hub runs is the servers' package too
    else:
        try:
            made = demo_env.ensure(Path(os.environ.get("GPUSHARE_DEMO_ENV") or
                                        demo_env.default_env(HERE.parent)), HERE.parent)
        except demo_env.DemoEnvError as exc:
            sys.exit(f"gpushare demo: {exc}")
        BIN = Path(made["bin"])
        STARTUP = str(Path(made["spawner"]) / "pythonstartup.py")
    c.LocalGPUShareSpawner.run_as_hub_user = False  # every server as its user, never as root
else:
    BIN, STARTUP = Path(sys.executable).parent, None
    c.LocalGPUShareSpawner.run_as_hub_user = True  # every server as you, in /tmp/<user>
# Homes elsewhere than the accounts' own (the demo's test keeps everything in its folder).
HOMES = os.environ.get("GPUSHARE_DEMO_HOMES")
if HOMES:
    c.LocalGPUShareSpawner.user_home_template = f"{HOMES}/{{username}}"
    c.LocalGPUShareSpawner.hub_user_home_template = f"{HOMES}/{{username}}"
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.environment["PATH"] = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
if STARTUP:
    c.LocalGPUShareSpawner.kernel_startup_file = STARTUP
# Terminals as interactive, not login, shells: a login shell's /etc/profile resets PATH and
# `gpushare` would not be found; ~/.bashrc is still read.
c.Spawner.args = ['--ServerApp.terminado_settings={"shell_command": ["/bin/bash", "-i"]}']

pool_config = HERE / "gpushare_config.py"
c.JupyterHub.services = [{
    "name": "gpushare",
    "url": f"http://127.0.0.1:{SERVICE_PORT}",
    # The supervisor starts the service again at once if it dies (the hub would notice only
    # at its 30 s poll); see docs/explanation/reliability.md.
    "command": [sys.executable, "-m", "jupyter_gpushare.pool.supervisor",
                f"--PoolService.config_file={pool_config}",
                f"--PoolService.state_dir={STATE / 'pool'}"]
               # without root, one account runs everything: gangs meet on the host's loopback
               + ([] if AS_ROOT else ["--LocalBackend.run_as_service_user=True",
                                      "--LocalBackend.gang_network=host"])
               + ([f"--PoolService.checkpoint_dir_template={HOMES}/{{user}}/.gpushare/"
                   f"checkpoints/{{job_id}}"] if HOMES else []),
    "cwd": str(STATE),
    # Not in the hub's Services menu, which lists it to every user (each server may access
    # it) while only pool admins may see the dashboard: they get "GPU pool" in the hub's
    # navigation bar instead (HUB_TEMPLATES, below).
    "display": False,
    # The dashboard's browser login through the hub (OAuth; the redirect URI is the default,
    # /services/gpushare/oauth_callback): no "authorize access" question for a service of
    # the hub's own, and pool admins' custom scope in their login, so that they get in.
    "oauth_no_confirm": True,
    "oauth_client_allowed_scopes": ["custom:gpushare:admin"],
}, {
    "name": "gpushare-spawner",  # no process: the identity the spawner reserves slices with
    "api_token": c.LocalGPUShareSpawner.pool_api_token,
    "display": False,
}]

c.JupyterHub.template_paths = [HUB_TEMPLATES]


def _from(variable, file):
    return variable if os.environ.get(variable) else STATE / file


print(f"gpushare demo: log in at http://127.0.0.1:{PORT} as alice, bob or carol with the "
      f"password {DEMO_PASSWORD} (from {_from('GPUSHARE_DEMO_PASSWORD', 'demo-password')}), "
      f"as admin with {ADMIN_PASSWORD} (from "
      f"{_from('GPUSHARE_DEMO_ADMIN_PASSWORD', 'demo-admin-password')})", file=sys.stderr)
