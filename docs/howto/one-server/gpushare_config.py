"""The gpushare pool service's settings: /opt/jupyterhub/etc/jupyterhub/gpushare_config.py.

`python -m jupyter_gpushare.pool --help-all` lists every option."""

import socket

c = get_config()  # noqa: F821

# Projects: the train pool's queues, each with the GPUs guaranteed to it. Members are the
# JupyterHub groups named. The quotas may add up to the train pool's GPUs at most: on an
# 8-GPU server whose GPU 0 serves the notebooks, 7.
c.PoolService.projects = {
    "vision": {"quota": 3, "groups": ["vision"]},
    "nlp": {"quota": 3, "groups": ["nlp"], "limit": 6},
}

# The build pool: this server's GPU 0, cut into the notebooks' slices. The train pool is
# every other GPU of the server.
c.PoolService.build_nodes = {socket.gethostname(): 1}
c.PoolService.build_allowance = 0.5  # GPUs of slices one user may hold, all servers together

c.PoolService.grace_period = 30  # a preempted job gets SIGTERM, then SIGKILL 30 s later
