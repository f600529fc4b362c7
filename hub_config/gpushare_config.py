"""The demo's pool service configuration (``python -m jupyter_gpushare.pool --help-all``)."""

import socket

from jupyter_gpushare.gpus import NVMLInventory

c = get_config()  # noqa: F821

# Three projects with a guaranteed 2 GPUs each on the 8-GPU demo pool; any may borrow the rest.
c.PoolService.projects = {
    "vision": {"quota": 2, "groups": ["vision"]},
    "nlp": {"quota": 2, "groups": ["nlp"]},
    "speech": {"quota": 2, "groups": ["speech"]},
}
# Two departments over them: vision and nlp share research's 4 GPUs (an idle quota of one goes
# to the other first), speech is alone in operations.
c.PoolService.departments = {
    "research": {"quota": 4, "projects": ["vision", "nlp"]},
    "operations": {"quota": 2, "projects": ["speech"]},
}
c.PoolService.grace_period = 10
# The demo runs anywhere: without a GPU, a labelled simulated train pool (a real hub leaves
# this off, so that a server whose NVIDIA driver is missing refuses to start).
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 2
c.LocalBackend.simulated_gpus_per_node = 4
# Jobs run as their users: pass them the locale, not the service's own PATH or virtualenv.
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]

# The build pool, cut into notebook slices (at most ½ GPU per user, all servers together).
# Without a GPU: one labelled simulated build GPU beside the simulated train pool. With GPUs:
# this host's GPU 0, which the train pool then leaves out; on a machine with one GPU, train
# jobs share it with the slices, so that the demo has a train pool at all.
_nvml = NVMLInventory()
_one_gpu = False
if _nvml.problem() is None:
    c.PoolService.build_nodes = {socket.gethostname(): 1}
    c.LocalBackend.share_build_gpus = _one_gpu = len(_nvml.gpus()) == 1
else:
    c.PoolService.build_nodes = {"sim-build-0": 1}
c.PoolService.build_allowance = 0.5
# One virtual pool: the build GPU, while no notebook holds a slice of it, runs train jobs
# beyond their projects' quotas; a notebook that starts takes it back (the job there is
# requeued after the grace period, and the spawn page says so). No GPU is kept in reserve
# here, so that lending can be seen on a pool of one build GPU (the default keeps one).
c.PoolService.lend_build_gpus = not _one_gpu  # one GPU: shared with train jobs instead
c.PoolService.build_reserve = 0

# GPU utilization: read every 5 s (NVML, or without a GPU the NVML stand-in over the simulated
# GPUs, playing .demo-state/pool/nvml-standin.json if you write one; see
# docs/explanation/utilization.md). Idle
# train jobs are flagged after 10 minutes here (30 by default) and taken first when GPUs are
# reclaimed. Build sessions whose slice shows no GPU use and whose server the hub saw no
# activity from for 5 minutes are warned, and stopped 2 minutes later: short, so it can be seen.
c.GPUUsage.idle_job_after = 600
c.GPUUsage.cull_idle_slices_after = 300
c.GPUUsage.cull_warning = 120
