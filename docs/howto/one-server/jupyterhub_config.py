# ---- jupyter-gpushare --------------------------------------------------------------------
# Append this to your jupyterhub_config.py. It makes every notebook server hold a build slice
# of a GPU, and runs the gpushare pool service (the train pool) as a service of the hub.
import sys
from pathlib import Path

from jupyter_gpushare.dashboard import HUB_TEMPLATES

gpushare_dir = Path(__file__).resolve().parent  # where gpushare_config.py and the token are

# Every notebook server gets a build slice, through the gpushare spawner (a
# LocalProcessSpawner: servers still run as their users' system accounts).
c.JupyterHub.spawner_class = "gpushare-local"
c.LocalGPUShareSpawner.build_profiles = [
    {"gpus": 0.25, "default": True},      # "¼ GPU"
    {"gpus": 0.5, "groups": ["vision"]},  # "½ GPU", offered to the vision group only
    {"gpus": 0},                          # "CPU only"
]

c.JupyterHub.services.extend([
    # The pool service: started by the hub (and restarted at once by its supervisor if it
    # dies), reached through the proxy at /services/gpushare/. Its own settings are in
    # gpushare_config.py; its database and job logs in /var/lib/gpushare.
    {"name": "gpushare",
     "url": "http://127.0.0.1:10101",
     "command": [sys.executable, "-m", "jupyter_gpushare.pool.supervisor",
                 f"--PoolService.config_file={gpushare_dir / 'gpushare_config.py'}",
                 "--PoolService.state_dir=/var/lib/gpushare"],
     # Not in the hub's Services menu: it would list the service to every user (their
     # servers access it) and non-admins would land on a refusal; pool admins get "GPU pool"
     # in the hub's navigation bar instead (HUB_TEMPLATES, below).
     "display": False,
     "oauth_no_confirm": True,        # no "authorize access" question for the dashboard
     "oauth_client_allowed_scopes": ["custom:gpushare:admin"]},
    # The identity the spawner reserves build slices with: users never reserve them.
    {"name": "gpushare-spawner",
     "api_token": (gpushare_dir / "gpushare-spawner-token").read_text().strip()},
])
c.JupyterHub.template_paths.insert(0, HUB_TEMPLATES)
c.JupyterHub.custom_scopes.update({
    "custom:gpushare:admin": {"description": "Administer the gpushare pool."},
})
c.JupyterHub.load_roles.extend([
    # Users may reach the pool service (the default user role is "self" only).
    {"name": "user", "scopes": ["self", "access:services!service=gpushare"]},
    # The service asks the hub who is an admin, who is in which group, and which servers run.
    {"name": "gpushare-service", "services": ["gpushare"],
     "scopes": ["read:users", "read:groups", "list:groups", "read:servers"]},
    {"name": "gpushare-spawner", "services": ["gpushare-spawner"],
     "scopes": ["access:services!service=gpushare"]},
])
# Notebook servers pass access to the pool on to their kernels and terminals (%%train, the
# gpushare command), and tell the hub of activity.
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!user",
                                 "access:services!service=gpushare"]
