"""The demo's pool service configuration (``python -m jupyter_gpushare.pool --help-all``)."""

c = get_config()  # noqa: F821

# Two projects with a guaranteed 2 GPUs each on the 8-GPU demo pool; either may borrow the rest.
c.PoolService.projects = {
    "vision": {"quota": 2, "groups": ["vision"]},
    "nlp": {"quota": 2, "groups": ["nlp"]},
}
c.PoolService.grace_period = 10
c.LocalBackend.simulated_nodes = 2
c.LocalBackend.simulated_gpus_per_node = 4
# Jobs run as their users: pass them the locale, not the service's own PATH or virtualenv.
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
